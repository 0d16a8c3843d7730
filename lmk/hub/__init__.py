"""The Hugging Face hub, for jobs on compute nodes without internet (no model framework imported here).

    offline.py    are we offline? is this a hub id? (answered once for every layer)
    mirror.py     a folder of hub repos (hub.mirror / LMK_HUB_MIRROR) that models, data and mteb tasks read;
                  completion markers: a partial download is never taken as present
    artifacts.py  what a job loads from the hub (required_artifacts) and whether it is on disk (check_available)
    task_registry.py  mteb's task names, cached per mteb version (a misspelt task fails before mteb loads)
    fetch.py      downloading them on a login node, with a manifest (`python -m lmk.download`); interrupt_download
                  leaves a partial one (fault injection)
"""

from lmk import interface

__all__, __getattr__ = interface(__name__, {
    "lmk.hub.artifacts": ("Artifact", "MissingArtifactsError", "cache_manifest_path", "check_available",
                          "data_sources", "eval_task_names", "required_artifacts"),
    "lmk.hub.fetch": ("download", "prefetch"),
    "lmk.hub.mirror": ("STARTED", "apply_mirror", "incomplete", "mark_complete", "mark_started",
                       "resolve_model", "with_mirrored_sources"),
    "lmk.hub.offline": ("hub_offline", "is_hub_id"),
    "lmk.hub.push": ("PushError", "Pushed", "check_push", "push_folder"),
    "lmk.hub.task_registry": ("hub_task_names",),
}, modules=("artifacts", "fetch", "mirror"))
