"""The XGBoost hook: a training callback that saves what the XGBoost rules and reports read.

One boosting round is one TRAIN step. At each saved round (``SaveConfig``; default every 10
rounds, as smdebug's XGBoost hook) the hook saves, per included collection:

* ``metrics``: ``<data>-<metric>`` (``train-rmse``, ``validation-logloss``) from ``evals``;
  always included;
* ``hyperparameters`` (round 0 only unless given a schedule): ``hyperparameters/<name>``,
  numbers as float64, anything else as a string tensor; from ``hyperparameters=`` or, when not
  given, from the booster's own configuration;
* ``feature_importance``: ``feature_importance/<type>/<feature>`` for the types weight, gain,
  cover, total_gain, total_cover, normalised to sum 1 per type; every feature of the model is
  saved, unused ones as 0 (XGBoost's ``get_score`` leaves them out);
* ``trees``: the trees added since the previous saved round, as numeric columns of
  ``Booster.trees_to_dataframe`` (``trees/Tree``, ``Node``, ``Yes``, ``No``, ``Missing``,
  ``Split``, ``Gain``, ``Cover``; children as node numbers, -1 for leaves; a leaf's Gain is its
  value) plus ``trees/Depth`` (each node's depth, root 0) and ``trees/Feature`` (strings, "Leaf"
  for leaves). Read from the JSON dump, so pandas is not needed. Only new trees are saved: the
  whole model at every saved round would grow quadratically with the number of rounds;
* ``labels``, ``predictions``: ``labels`` and ``predictions`` of ``validation_data`` (else
  ``train_data``), predicted with the model as of that round;
* ``full_shap`` / ``average_shap`` (only when named in ``include_collections``: SHAP values
  cost a prediction pass with ``pred_contribs=True``): ``full_shap/<feature>`` (one value per
  row of ``train_data``, else ``validation_data``) and ``average_shap/<feature>`` (the mean
  absolute SHAP value), each with ``bias``.

Fail open: an error inside the hook disables it and training continues.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import xgboost
from xgboost.callback import TrainingCallback

from trainguard.config.capture_config import CaptureConfig
from trainguard.config.collections import Collection, CollectionManager
from trainguard.config.reduction_config import ReductionConfig
from trainguard.config.save_config import SaveConfig
from trainguard.errors import ConfigError
from trainguard.hooks.base import BaseHook
from trainguard.hooks.hook_arguments import capture_arguments

__all__ = ["IMPORTANCE_TYPES", "XGBoostHook", "tree_columns", "xgboost_collections"]

logger = logging.getLogger("trainguard")

IMPORTANCE_TYPES = ("weight", "gain", "cover", "total_gain", "total_cover")
DEFAULT_XGBOOST_SAVE_INTERVAL = 10

# Built-in XGBoost collections (SageMaker's names) and the tensor names each one holds.
XGBOOST_COLLECTIONS: dict[str, list[str]] = {
    "metrics": [],  # filled with the evals' metric names as they appear
    "hyperparameters": [r"^hyperparameters/"],
    "feature_importance": [r"^feature_importance/"],
    "trees": [r"^trees/"],
    "labels": [r"^labels$"],
    "predictions": [r"^predictions$"],
    "full_shap": [r"^full_shap/"],
    "average_shap": [r"^average_shap/"],
    "all": [],
    "default": [],
}
_TREE_COLUMNS = ("Tree", "Node", "Depth", "Yes", "No", "Missing", "Split", "Gain", "Cover")


def xgboost_collections() -> CollectionManager:
    return CollectionManager(Collection(name, list(patterns)) for name, patterns in XGBOOST_COLLECTIONS.items())


def tree_columns(dumps: Sequence[str], first_tree: int = 0) -> dict[str, np.ndarray]:
    """Numeric ``trees/`` columns (and Feature strings) of JSON tree dumps (``get_dump(dump_format="json")``)."""
    rows: dict[str, list[Any]] = {column: [] for column in (*_TREE_COLUMNS, "Feature")}
    for offset, dump in enumerate(dumps):
        stack = [(json.loads(dump), 0)]
        while stack:
            node, depth = stack.pop()
            children = node.get("children") or []
            leaf = not children
            rows["Tree"].append(first_tree + offset)
            rows["Node"].append(node["nodeid"])
            rows["Depth"].append(depth)
            rows["Feature"].append("Leaf" if leaf else str(node.get("split", "")))
            rows["Yes"].append(-1 if leaf else node.get("yes", -1))
            rows["No"].append(-1 if leaf else node.get("no", -1))
            rows["Missing"].append(-1 if leaf else node.get("missing", -1))
            rows["Split"].append(np.nan if leaf else float(node.get("split_condition", np.nan)))
            rows["Gain"].append(float(node["leaf"]) if leaf else float(node.get("gain", np.nan)))
            rows["Cover"].append(float(node.get("cover", np.nan)))
            stack.extend((child, depth + 1) for child in reversed(children))
    columns = {name: np.asarray(values, dtype=np.float64) for name, values in rows.items() if name != "Feature"}
    for name in ("Tree", "Node", "Depth", "Yes", "No", "Missing"):
        columns[name] = columns[name].astype(np.int64)
    columns["Feature"] = np.asarray(rows["Feature"], dtype=object)
    return columns


class XGBoostHook(BaseHook, TrainingCallback):
    """Pass it to ``xgboost.train(..., callbacks=[hook])``. Arguments as smdebug's XGBoost hook."""

    framework = "xgboost"
    default_collections = ("metrics", "hyperparameters", "feature_importance", "trees", "labels", "predictions")
    always_included = ("metrics",)

    def __init__(
        self,
        out_dir: str | os.PathLike[str] | None = None,
        export_tensorboard: bool = False,
        tensorboard_dir: str | None = None,
        dry_run: bool = False,
        reduction_config: ReductionConfig | None = None,
        save_config: SaveConfig | None = None,
        include_regex: Sequence[str] | str | None = None,
        include_collections: Sequence[str] | None = None,
        save_all: bool = False,
        include_workers: str = "one",
        hyperparameters: Mapping[str, Any] | None = None,
        train_data: xgboost.DMatrix | None = None,
        validation_data: xgboost.DMatrix | None = None,
        *,
        config: CaptureConfig | None = None,
        collection_manager: CollectionManager | None = None,
        other_workers_collections: Sequence[str] | None = None,
        endpoint_url: str | None = None,
        profile: str | None = None,
        region: str | None = None,
    ) -> None:
        given = capture_arguments(locals())
        if config is None:
            config = CaptureConfig(**given)
        elif given:
            raise ConfigError(f"pass the capture settings as config= or as arguments, not both: got {', '.join(given)}")
        # reduction_config is accepted for smdebug compatibility and ignored, as smdebug does:
        # XGBoost's tensors are small and saved raw; the writer process and the overhead budget
        # are the PyTorch hook's.
        config = config.replace(
            reduction_config=None, writer=None, overhead_budget=None, overhead_max_interval=None,
            save_config=config.save_config or SaveConfig(save_interval=DEFAULT_XGBOOST_SAVE_INTERVAL),
        )  # fmt: skip
        super().__init__(dry_run=dry_run, config=config, collection_manager=collection_manager or xgboost_collections())
        TrainingCallback.__init__(self)
        for data, argument in ((train_data, "train_data"), (validation_data, "validation_data")):
            # callers without a type checker pass anything: refused here, not deep in xgboost
            if data is not None and not isinstance(data, xgboost.DMatrix):
                message = f"{argument} must be an xgboost.DMatrix, got {type(data).__name__}"  # type: ignore[unreachable]
                raise ConfigError(message)
        self.hyperparameters = dict(hyperparameters) if hyperparameters is not None else None
        self.train_data = train_data
        self.validation_data = validation_data
        hyperparameter_collection = self.collection_manager.get("hyperparameters")
        if hyperparameter_collection.save_config is None:
            hyperparameter_collection.save_config = SaveConfig(save_steps=[0])
        self._shap_requested = {"full_shap", "average_shap"} & set(include_collections or ())
        self._trees_written = 0
        self._rounds_written = 0

    # -- copying: xgboost's scikit-learn API deep-copies its callbacks --------------------------
    def __deepcopy__(self, memo: dict[int, Any]) -> XGBoostHook:
        return self  # the hook is a handle on one output directory, never duplicated

    # -- distributed --------------------------------------------------------------------------
    def _rank_and_world(self) -> tuple[int, int]:
        try:
            from xgboost import collective

            return collective.get_rank(), collective.get_world_size()
        except Exception:  # noqa: BLE001 - no communicator: a single process
            return 0, 1

    # -- the xgboost callback ---------------------------------------------------------------------
    def before_training(self, model: Any) -> Any:
        # The model may already hold trees (training continued from xgb_model): only new trees
        # are saved, so start counting after the existing ones.
        try:
            if isinstance(model, xgboost.Booster):
                self._rounds_written = model.num_boosted_rounds()
                self._trees_written = len(model.get_dump()) if self._rounds_written else 0
        except Exception as error:  # noqa: BLE001 - fail open
            self.disable(error)
        return model

    def after_iteration(self, model: Any, epoch: int, evals_log: Mapping[str, Mapping[str, Any]]) -> bool:
        if not self.enabled:
            return False
        try:
            self.begin_step()
            if self.saving_this_step:
                self._save_round(model, evals_log)
            self.end_step()
        except Exception as error:  # noqa: BLE001 - fail open: training goes on without capture
            self.disable(error)
        return False

    def after_training(self, model: Any) -> Any:
        self.close()
        return model

    # -- what one saved round writes ----------------------------------------------------------
    def _save_round(self, model: Any, evals_log: Mapping[str, Mapping[str, Any]]) -> None:
        due = self._due
        for data_name, metrics in (evals_log or {}).items():
            for metric, history in metrics.items():
                if len(history):
                    value = history[-1]
                    value = value[0] if isinstance(value, (tuple, list)) else value  # xgboost.cv: (mean, std)
                    # a metric is one number: saved with shape (), as the user logged it (runs
                    # written before hold shape (1,); readers take either)
                    self._save(f"{data_name}-{metric}", np.array(float(value)), "metrics")
        if not isinstance(model, xgboost.Booster):
            return  # xgboost.cv passes a CVPack: only its metrics are saved
        everything = "all" in due  # save_all: every collection's tensors (SHAP still only when named)
        if "hyperparameters" in due or everything:
            self._save_hyperparameters(model)
        if "feature_importance" in due or everything:
            self._save_feature_importance(model)
        if "trees" in due or everything:
            self._save_trees(model)
        if due & {"labels", "predictions"} or everything:
            self._save_labels_and_predictions(model)
        if due & self._shap_requested:
            self._save_shap(model)

    def _save(self, name: str, value: np.ndarray, collection: str) -> None:
        group = self.collection_manager.get(collection)
        if not group.matches(name):
            group.add_tensor_name(name)
            self._collections_dirty = True
            self._match_cache.pop(name, None)
            self._plan_cache.clear()
        if self.plan(name) is None:
            return
        array = np.asarray(value)
        if array.dtype == object:
            array = array.astype(str)
        nbytes = array.nbytes if array.dtype.kind != "U" else sum(len(item) for item in array.tolist())
        self.write_tensor(name, array, nbytes=nbytes)

    def _feature_names(self, model: xgboost.Booster) -> list[str]:
        names = model.feature_names
        if names:
            return list(names)
        return [f"f{index}" for index in range(model.num_features())]

    def _save_hyperparameters(self, model: xgboost.Booster) -> None:
        parameters = self.hyperparameters if self.hyperparameters is not None else _booster_parameters(model)
        for key, value in sorted(parameters.items()):
            if isinstance(value, (bool, int, float, np.number)):
                array = np.array([float(value)])
            else:
                try:
                    array = np.array([float(value)])
                except (TypeError, ValueError):
                    array = np.array([str(value)])
            self._save(f"hyperparameters/{key}", array, "hyperparameters")

    def _save_feature_importance(self, model: xgboost.Booster) -> None:
        features = self._feature_names(model)
        for importance_type in IMPORTANCE_TYPES:
            scores = model.get_score(importance_type=importance_type)
            # float per feature for tree boosters (the stub allows the lists of linear ones)
            values = np.array([float(scores.get(feature, 0.0)) for feature in features])  # type: ignore[arg-type]
            total = values.sum()
            if total > 0:
                values = values / total
            for feature, value in zip(features, values, strict=True):
                self._save(f"feature_importance/{importance_type}/{feature}", np.array([value]), "feature_importance")

    def _save_trees(self, model: xgboost.Booster) -> None:
        rounds = model.num_boosted_rounds()
        if rounds <= self._rounds_written:
            return
        try:
            dumps = model[self._rounds_written : rounds].get_dump(dump_format="json", with_stats=True)
        except (xgboost.core.XGBoostError, ValueError, IndexError):
            dumps = model.get_dump(dump_format="json", with_stats=True)[self._trees_written :]
        self._rounds_written = rounds
        if not dumps or '"nodeid"' not in dumps[0]:
            return  # gblinear: no trees
        columns = tree_columns(dumps, first_tree=self._trees_written)
        self._trees_written += len(dumps)
        for column, values in columns.items():
            self._save(f"trees/{column}", values, "trees")

    def _evaluation_data(self) -> xgboost.DMatrix | None:
        return self.validation_data if self.validation_data is not None else self.train_data

    def _save_labels_and_predictions(self, model: xgboost.Booster) -> None:
        data = self._evaluation_data()
        if data is None:
            return
        labels = data.get_label()
        if labels.size:
            self._save("labels", np.asarray(labels), "labels")
        self._save("predictions", np.asarray(model.predict(data)), "predictions")

    def _save_shap(self, model: xgboost.Booster) -> None:
        data = self.train_data if self.train_data is not None else self.validation_data
        if data is None:
            return
        contributions = np.asarray(model.predict(data, pred_contribs=True))
        names = [*self._feature_names(model), "bias"]
        for index, feature in enumerate(names[: contributions.shape[-1]]):
            column = contributions[..., index]
            if "full_shap" in self._shap_requested:
                self._save(f"full_shap/{feature}", column, "full_shap")
            if "average_shap" in self._shap_requested:
                self._save(f"average_shap/{feature}", np.array([float(np.mean(np.abs(column)))]), "average_shap")


def _booster_parameters(model: xgboost.Booster) -> dict[str, Any]:
    """The training parameters the booster reports (its JSON configuration, flattened)."""
    config = json.loads(model.save_config()).get("learner", {})
    found: dict[str, Any] = {}
    found.update(config.get("learner_train_param", {}))
    found.update(config.get("generic_param", {}))
    booster = config.get("gradient_booster", {})
    for section in ("tree_train_param", "gbtree_train_param"):
        found.update(booster.get(section, {}))
    for updater in booster.get("updater", []) if isinstance(booster.get("updater"), list) else []:
        found.update(updater.get("train_param", {}) if isinstance(updater, dict) else {})
    objective = config.get("objective", {})
    if "name" in objective:
        found["objective"] = objective["name"]
    return {key: value for key, value in found.items() if isinstance(value, (str, int, float, bool))}
