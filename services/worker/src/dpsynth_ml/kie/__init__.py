"""Key-information extraction (KIE): LayoutLMv3 token classification trained with DP-Adam,
the DOCUMENT (or its declared owner) being the privacy unit (docs/kie.md).

Every chunk of a document goes through the subject-level DP-SGD path of
:class:`dpsynth_ml.dp.DpSgdEngine`: Poisson sampling over documents, one contribution per
document clipped once to C, the noise sigma*C added once per step.
"""

from dpsynth_ml.kie.data import KieDataset, KieDocument, load_kie_dataset, parse_kie_dataset
from dpsynth_ml.kie.metrics import entity_f1, evaluate_kie, predict_words, token_f1
from dpsynth_ml.kie.model import (
    KieModel,
    build_kie_model,
    load_kie_model,
    save_kie_model,
    tiny_config,
)
from dpsynth_ml.kie.tokenize import (
    EncodedChunks,
    HashingTokenizer,
    JsonTokenizer,
    encode_documents,
)
from dpsynth_ml.kie.train import KieDpSettings, KieTrainResult, train_kie_dp

__all__ = ["EncodedChunks", "HashingTokenizer", "JsonTokenizer", "KieDataset", "KieDocument",
           "KieDpSettings", "KieModel", "KieTrainResult", "build_kie_model", "encode_documents",
           "entity_f1", "evaluate_kie", "load_kie_dataset", "load_kie_model", "parse_kie_dataset",
           "predict_words", "save_kie_model", "tiny_config", "token_f1", "train_kie_dp"]
