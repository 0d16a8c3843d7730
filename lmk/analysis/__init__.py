"""Position-bias probes: where does each pooling "look" in a long input? (docs/method.md section 6)

Three probes, each a plain function over an `EmbeddingModel` (the notebook
`notebooks/attention_position_bias.ipynb` only calls these), one module each:

1. `attention` - `attention_profile`: attention mass from the pooled positions (the [CLS] row for CLS
   pooling, the landmark rows (`pool_mask`) for LMK, every non-pad row for mean) over key positions binned
   by relative position, per layer, averaged over heads, rows and inputs.
2. `evidence` - `evidence_position_sensitivity` + `depth_length_table`: retrieval Acc@1 by argmax cosine
   (an analysis view, NOT the leaderboard metric, which mteb computes) against needle depth x context
   length on the regenerated passkey / needle data.
3. `position` - `position_similarity` + `position_curve`: cosine between a long document's pooled
   embedding and the embedding of each of its chunks alone, against the chunk's relative position.

`landmark_winners` is the per-landmark view of MaxSim scoring: for each needle query, which document landmark
wins the MaxSim against the landmark of the needle's chunk, per pooling and training objective side by side. `lengths` reads a Table 2 sweep's per-query scores into score vs document length per pooling (the
paper's Figure 1 view, nothing re-encoded). `runs` picks the models to compare (the latest
`make reproduce-table2` runs, else untrained encoders), `plots` draws the results.
Everything is re-exported here, so `from lmk import analysis as an; an.attention_profile(...)` works.
"""

from lmk import interface
from lmk.analysis.attention import (
    PROBE_ATTN,
    ROW_KINDS,
    AttentionProfile,
    AttentionRecorder,
    NotApplicable,
    attention_profile,
    bin_attention,
    pooled_rows,
    pooling_kind,
    probe_attention,
    profile_models,
    record_pooled_attention,
)
from lmk.analysis.common import RunName, bin_centers, objective_label
from lmk.analysis.evidence import (
    TASKS,
    depth_bins,
    depth_length_table,
    evidence_position_sensitivity,
    long_texts,
    sensitivity_tables,
    synthetic_corpora,
)
from lmk.analysis.landmark_winners import (
    near_needle_share,
    needle_corpora,
    needle_landmark,
    objective_order,
    winners_by_objective,
    winning_landmarks,
)
from lmk.analysis.lengths import length_curves, length_scores, split_length
from lmk.analysis.plots import (
    plot_attention_profile,
    plot_attention_profiles,
    plot_depth_length_heatmap,
    plot_depth_length_heatmaps,
    plot_length_scores,
    plot_position_similarity,
    plot_winning_landmarks,
    plot_winning_landmarks_by_objective,
    save_figure,
)
from lmk.analysis.position import position_curve, position_similarity, similarity_curves
from lmk.analysis.runs import (
    ModelChoice,
    choose_models,
    latest_table2_sweep,
    load_models,
    pick_table2_sweep,
    sweep_scale,
    trained_runs,
)

_LATER, __getattr__ = interface(__name__, {}, modules=("notebooks",))  # the runner imports nbclient: on use
__all__ = [
    *_LATER,
    "AttentionRecorder",
    "PROBE_ATTN",
    "ROW_KINDS",
    "NotApplicable",
    "TASKS",
    "AttentionProfile",
    "ModelChoice",
    "attention_profile",
    "bin_attention",
    "bin_centers",
    "choose_models",
    "depth_bins",
    "depth_length_table",
    "evidence_position_sensitivity",
    "latest_table2_sweep",
    "pick_table2_sweep",
    "sweep_scale",
    "length_curves",
    "length_scores",
    "load_models",
    "long_texts",
    "plot_attention_profile",
    "plot_attention_profiles",
    "plot_depth_length_heatmap",
    "plot_depth_length_heatmaps",
    "plot_length_scores",
    "plot_position_similarity",
    "plot_winning_landmarks",
    "plot_winning_landmarks_by_objective",
    "near_needle_share",
    "needle_corpora",
    "needle_landmark",
    "objective_label",
    "objective_order",
    "RunName",
    "winners_by_objective",
    "winning_landmarks",
    "pooled_rows",
    "pooling_kind",
    "position_curve",
    "position_similarity",
    "probe_attention",
    "record_pooled_attention",
    "profile_models",
    "save_figure",
    "sensitivity_tables",
    "similarity_curves",
    "split_length",
    "synthetic_corpora",
    "trained_runs",
]
