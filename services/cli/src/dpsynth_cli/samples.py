"""``dpsynth samples digits``: the README's sample data, made with one command.

scikit-learn's digits (1,797 8×8 grayscale images of 0-9, installed with scikit-learn; nothing
is downloaded) split with a fixed seed into a **public** part (40%: pretraining and the
feature network) and a **private** part (60%: the data dpsynth protects), each written as
an image-folder zip (``<label>/<index>.png``), the layout most users already have. ``make
demo`` (``scripts/demo.py``) starts from the same split but keeps only the public digits 0-4
(so that 5-9 can come only from the private data, and the private data's contribution shows).
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path
from typing import Annotated

import numpy as np
import typer

from dpsynth_cli.common import console

SPLIT_SEED = 20261121
"""The seed of the public/private split (fixed: the same records are public on every run)."""
PUBLIC_SHARE = 0.4

app = typer.Typer(help="Sample data to try dpsynth with (nothing is downloaded).",
                  no_args_is_help=True)


def split_digits() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """scikit-learn's digits as uint8 N×8×8×1 images and int64 labels, split by a fixed seed
    into ``public`` (40%) and ``private`` (60%) parts."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as exc:  # the CLI alone does not need scikit-learn
        raise typer.BadParameter("the digits sample needs scikit-learn: pip install "
                                 "scikit-learn") from exc
    digits = load_digits()
    images = np.clip(digits.images * 16, 0, 255).astype(np.uint8)[..., None]  # 0..16 → 0..255
    labels = digits.target.astype(np.int64)
    order = np.random.default_rng(SPLIT_SEED).permutation(len(labels))
    n_public = int(PUBLIC_SHARE * len(labels))
    public, private = order[:n_public], order[n_public:]
    return {"public": (images[public], labels[public]),
            "private": (images[private], labels[private])}


def write_image_folder_zip(path: Path, images: np.ndarray, labels: np.ndarray) -> Path:
    """Write ``images`` as PNGs in an image-folder zip: ``<label>/<index>.png``.

    Deterministic (sorted members, fixed timestamps): the same data gives the same bytes.
    """
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for i in np.argsort(labels, kind="stable"):
            buf = io.BytesIO()
            Image.fromarray(images[i][..., 0], mode="L").save(buf, format="PNG")
            info = zipfile.ZipInfo(f"{int(labels[i])}/{int(i):05d}.png",
                                   date_time=(2026, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, buf.getvalue())
    tmp.replace(path)
    return path


@app.command("digits")
def digits(out: Annotated[Path, typer.Option(
        "--out", "-o", help="folder to write digits-public.zip and digits-private.zip to")]
        = Path("samples")) -> None:
    """Write scikit-learn's digits as two image-folder zips: a public part (40%, to
    pretrain on) and a private part (60%, the data to protect)."""
    parts = split_digits()
    for part, hint in (("public", "upload with --visibility public; pretrain on it"),
                       ("private", "upload with --visibility private and a budget")):
        images, labels = parts[part]
        path = write_image_folder_zip(out / f"digits-{part}.zip", images, labels)
        console.print(f"{path}: {len(labels)} images 8×8, classes 0-9 ({hint})",
                      highlight=False, soft_wrap=True)
