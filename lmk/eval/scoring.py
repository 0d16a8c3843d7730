"""Deprecated alias: `lmk.eval.scoring` is `lmk.eval.score_stats` (`eval.scoring` is the setting single / maxsim)."""

import sys
import warnings

from lmk.eval import score_stats

warnings.warn("lmk.eval.scoring is deprecated: import lmk.eval.score_stats", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = score_stats  # `from lmk.eval.scoring import paired_ttest` keeps working
