"""What a claim carries (inputs of the attempt) and the lineage of models jobs produce.

A model's ``job_ids`` are the jobs whose steps produced it on its dataset: the job itself and,
when its base model was DP-trained on the SAME dataset, that model's jobs (docs/privacy.md: a
model's ``job_epsilon`` covers its DP ancestors on the same dataset).
"""

from __future__ import annotations

from dpsynth_shared.errors import DpsynthError, ErrorCode, NotFound
from dpsynth_shared.ids import is_valid_id, new_model_id
from dpsynth_shared.worker_contract import (
    Claim,
    CorpusRef,
    DatasetInfo,
    ModelRef,
    RegisterArtifact,
)
from sqlalchemy.orm import Session

from dpsynth_api.datasets.derive import selection_of
from dpsynth_api.jobs import repository as jobs_repo
from dpsynth_api.jobs.audits import model_audit
from dpsynth_api.jobs.kinds.audit import audit_target
from dpsynth_api.models import repository as models_repo
from dpsynth_api.models.conditioning import check_layout_generator, layout_channels, model_target
from dpsynth_api.models.info_file import model_space
from dpsynth_api.settings import ApiSettings
from dpsynth_api.tables import Artifact, Dataset, Job, Model


def _model(session: Session, job: Job) -> Model | None:
    if job.model_id is None:
        return None
    model = models_repo.get_for_tenant(session, tenant_id=job.tenant_id, model_id=job.model_id)
    if model is None:
        raise NotFound("model", job.model_id)
    return model


def _dataset(session: Session, job: Job) -> Dataset | None:
    return session.get(Dataset, job.dataset_id) if job.dataset_id else None


def _layout_dataset(session: Session, job: Job) -> DatasetInfo | None:
    """generate: the PUBLIC dataset whose masks condition sampling (checked at submission,
    checked again here: a private dataset's masks never reach a generate job)."""
    source = (job.spec or {}).get("layout_source") if job.type == "generate" else None
    if not source or not source.get("dataset_id"):
        return None
    dataset = session.get(Dataset, source["dataset_id"])
    if dataset is None or dataset.tenant_id != job.tenant_id:
        raise NotFound("dataset", source["dataset_id"])
    if dataset.visibility != "public" or not dataset.has_masks:
        raise DpsynthError(ErrorCode.PRIVATE_CONDITIONING_REFUSED,
                           f"dataset {dataset.id} is not a public dataset with layout masks")
    return DatasetInfo(dataset_id=dataset.id, visibility="public",
                       object_key=dataset.object_key, class_names=list(dataset.class_names),
                       declared_size=dataset.declared_size, has_masks=True,
                       declared_public_by=dataset.declared_public_by,
                       selection=selection_of(dataset))


def _layout_model(session: Session, job: Job) -> ModelRef | None:
    """generate: the layout generator whose masks condition sampling (checked at submission,
    checked again here: a model trained on private data without DP never draws them)."""
    source = (job.spec or {}).get("layout_source") if job.type == "generate" else None
    if not source or not source.get("model_id"):
        return None
    model = models_repo.get_for_tenant(session, tenant_id=job.tenant_id,
                                       model_id=source["model_id"])
    if model is None:
        raise NotFound("model", source["model_id"])
    check_layout_generator(model, session.get(Dataset, model.dataset_id)
                           if model.dataset_id else None)
    return model_ref(model)


def model_ref(model: Model, session: Session | None = None) -> ModelRef:
    """How a worker finds a model and its lineage (with ``session``: the budget of a DP
    model's dataset, so ancestors on a derived or linked dataset compose)."""
    budget = _budget_of(session, model.dataset_id) if session is not None and model.dp else None
    return ModelRef(model_id=model.id, object_key=model.object_key, dataset_id=model.dataset_id,
                    job_ids=list(model.job_ids or []), dp=model.dp, budget_id=budget)


def _same_budget(session: Session, first: str | None, second: str | None) -> bool:
    """Whether two datasets charge one budget (the same dataset, or one derived from or
    linked to the other: they share records, so DP training on both composes)."""
    if first is not None and first == second:
        return True
    budget = _budget_of(session, first)
    return budget is not None and budget == _budget_of(session, second)


def _budget_of(session: Session, dataset_id: str | None) -> str | None:
    """The ledger budget a private dataset charges (None for none or a public one)."""
    dataset = session.get(Dataset, dataset_id) if dataset_id else None
    if dataset is None or dataset.visibility != "private":
        return None
    return dataset.budget_id or dataset.id


def build_claim(session: Session, *, job: Job, settings: ApiSettings) -> Claim:
    """Everything the worker needs for this attempt, incl. the newest checkpoint to resume."""
    dataset = _dataset(session, job)
    model = _model(session, job)
    checkpoint = jobs_repo.latest_checkpoint(session, job.id)
    info = dataset_info(dataset) if dataset is not None else None
    evaluate = _evaluate_inputs(session, job) if job.type == "evaluate" else {}
    # audit: the audited finetune's settings, never its dataset's object (jobs/kinds/audit.py)
    target = audit_target(session, job) if job.type == "audit" else None
    return Claim(
        job_id=job.id, tenant_id=job.tenant_id, attempt=job.attempt,
        type=job.type,
        spec=job.spec, dataset=info, base_model=model_ref(model, session) if model else None,
        reservation_id=job.reservation_id,
        resume_checkpoint_key=checkpoint.object_key if checkpoint else None,
        resume_step=(checkpoint.checkpoint_step or 0) if checkpoint else 0,
        layout_dataset=_layout_dataset(session, job),
        layout_model=_layout_model(session, job), audit_target=target, **evaluate,
        lease_ttl_s=settings.lease_ttl_s, heartbeat_s=settings.heartbeat_s)


def dataset_info(dataset: Dataset) -> DatasetInfo:
    """How a worker reads a dataset: its object (and selection) and its held-out records
    (an upload's own; a derived dataset has none of its own)."""
    return DatasetInfo(dataset_id=dataset.id,
                       visibility=dataset.visibility, has_masks=bool(dataset.has_masks),
                       object_key=dataset.object_key, class_names=list(dataset.class_names),
                       declared_size=dataset.declared_size, delta=dataset.delta,
                       epsilon_limit=dataset.epsilon_limit, class_sizes=dataset.class_sizes,
                       privacy_unit="subject" if dataset.privacy_unit == "subject"
                       else "image",
                       selection=selection_of(dataset), budget_id=dataset.budget_id,
                       holdout_object_key=dataset.holdout_object_key,
                       holdout_size=dataset.holdout_size)


def _evaluate_inputs(session: Session, job: Job) -> dict[str, object]:
    """An evaluate claim's corpus, feature network (+ its public dataset) and the ledger's
    evaluation id (private reference), checked again at claim time."""
    spec = job.spec or {}
    artifact = session.get(Artifact, str(spec.get("corpus_artifact_id")))
    if artifact is None or artifact.tenant_id != job.tenant_id or artifact.kind != "corpus":
        raise NotFound("corpus artifact", str(spec.get("corpus_artifact_id")))
    producer = session.get(Job, artifact.job_id)
    sampled = (models_repo.get_for_tenant(session, tenant_id=job.tenant_id,
                                          model_id=producer.model_id)
               if producer is not None and producer.model_id else None)
    corpus = CorpusRef(artifact_id=artifact.id, object_key=artifact.object_key,
                       job_id=artifact.job_id, model_id=sampled.id if sampled else None,
                       dp=bool(sampled.dp) if sampled else False,
                       budget_id=_budget_of(session, sampled.dataset_id)
                       if sampled is not None and sampled.dp else None,
                       # the report shows it beside the corpus's ε, as of this claim
                       audit=model_audit(session, sampled) if sampled is not None else None)
    out: dict[str, object] = {"corpus": corpus,
                              "evaluation_id": (job.privacy or {}).get("evaluation_id"),
                              "dp_evaluation": (job.privacy or {}).get("dp"),
                              "holdout_overlap": (job.privacy or {}).get("holdout_overlap")}
    feature_id = spec.get("feature_model_id")
    if feature_id:
        feature = models_repo.get_for_tenant(session, tenant_id=job.tenant_id,
                                             model_id=str(feature_id))
        if feature is None or (feature.info or {}).get("model_kind") != "feature_net":
            raise DpsynthError(ErrorCode.INVALID_SPEC,
                               f"model {feature_id} is not a feature network")
        trained_on = session.get(Dataset, feature.dataset_id) if feature.dataset_id else None
        if trained_on is None or trained_on.visibility != "public":
            raise DpsynthError(ErrorCode.INVALID_SPEC, f"feature network {feature_id} was not "
                               "trained on a public dataset")
        out["feature_model"] = model_ref(feature)
        out["feature_dataset"] = dataset_info(trained_on)
    return out


def _model_id_for(session: Session, body: RegisterArtifact) -> str:
    """The worker names the model before uploading it (its key is ``models/{id}/...``); keep
    that id when it is well formed, matches the key and is unused, so id and key agree."""
    proposed = body.metadata.get("model_id")
    if (isinstance(proposed, str) and is_valid_id(proposed, "model")
            and body.object_key.startswith(f"models/{proposed}/")
            and session.get(Model, proposed) is None):
        return proposed
    return new_model_id()


def register_model(session: Session, *, job: Job, body: RegisterArtifact) -> Model:
    """Record the model a job produced, with its lineage (flush only)."""
    base = _model(session, job)
    dataset = _dataset(session, job)
    dp = job.type in ("finetune", "dp_train")
    job_ids = [job.id]
    if dp and base is not None and base.dp and _same_budget(session, base.dataset_id,
                                                            job.dataset_id):
        job_ids = [*base.job_ids, job.id]
    meta = body.metadata
    epsilon = meta.get("job_epsilon")
    rng = meta.get("rng")
    if base is not None and base.rng == "test":
        rng = "test"  # a descendant of a test-rng model is never publishable either
    kept = ("class_names", "image_size", "channels", "preset", "training_kind", "steps",
            "dataset_epsilon_spent")  # the filter figure when the model was made (item 8)
    info: dict[str, object] = {k: meta[k] for k in kept if k in meta}
    # layout conditioning: stated by the worker, else kept from the base model
    channels = layout_channels(meta) or (layout_channels(base.info or {}) if base else 0)
    if channels:
        info["layout_channels"] = channels
    if model_target(meta) == "masks":
        info["target"] = "masks"  # a layout generator (GenerateSpec.layout_source.model_id)
    if job.type in ("pretrain", "finetune"):
        # the denoiser's space: a pretrain's spec says it, a finetune keeps its base's
        stated = meta if "space" in meta or base is None else (base.info or {})
        info["space"] = model_space(stated)
    if job.type == "dp_train":
        # a directly DP-trained classifier (jobs/kinds/dp_train.py): downloadable, never a
        # diffusion base or a sampled model
        info["model_kind"] = "classifier"
        for key in ("architecture", "task", "privacy_unit"):
            if isinstance(meta.get(key), str):
                info[key] = meta[key]
    if job.type == "feature_net":
        # a feature network (jobs/kinds/feature_net.py): usable only as an evaluate job's
        # feature_model_id, never as a diffusion base or a sampled model
        info["model_kind"] = "feature_net"
        feature = meta.get("feature_net")
        if isinstance(feature, dict):
            info["feature_net"] = dict(feature)
        info["public_dataset_id"] = job.dataset_id
        if isinstance(meta.get("validation"), dict):
            info["validation"] = dict(meta["validation"])
    model = Model(id=_model_id_for(session, body), tenant_id=job.tenant_id,
                  name=str(meta.get("name") or f"{job.type} {job.id}"),
                  object_key=body.object_key, source="job", dataset_id=job.dataset_id,
                  job_ids=job_ids, produced_by_job_id=job.id, dp=dp,
                  job_epsilon=float(epsilon) if dp and epsilon is not None else None,
                  delta=dataset.delta if dp and dataset is not None else None,
                  rng=str(rng) if rng is not None else None, info=info, sha256=body.sha256,
                  size_bytes=body.size)
    return models_repo.add(session, model)
