"""Colours shared by the timeline, the breakdown bars and the HTML legend.

Based on the Okabe-Ito palette (Okabe & Ito, "Color Universal Design", 2008), which stays
distinguishable with the common colour-vision deficiencies. Colour is never the only cue:
every coloured thing also carries a label or a legend entry with text. One colour, one meaning:
the timeline, the idle bar and the step bars use the same colour for the same category, and no
two categories share one.
"""

from __future__ import annotations

BLUE = "#0072B2"
SKY = "#56B4E9"
GREEN = "#009E73"
ORANGE = "#E69F00"
VERMILLION = "#D55E00"
PURPLE = "#CC79A7"
YELLOW = "#F0E442"
GREY = "#8C8C8C"
DARK_GREY = "#4D4D4D"
LIGHT_GREY = "#C8C8C8"
PALE_GREY = "#E4E4E4"
#: Two more hues for the GPU idle causes, so that no colour means two things (Paul Tol's "muted"
#: scheme, also colour-blind safe: https://personal.sron.nl/~pault/).
WINE = "#882255"
TEAL = "#44AA99"

#: Timeline layers and breakdown categories (docs/metrics.md ``breakdown.order``).
CATEGORY_COLOR = {
    "kernel": BLUE,
    "memcpy": GREEN,
    "memset": SKY,
    "communication": PURPLE,
    "runtime": DARK_GREY,
    "dataloader": ORANGE,
    "cpu_exec": GREY,
    "other": PALE_GREY,
}

CATEGORY_LABEL = {
    "kernel": "GPU kernels",
    "memcpy": "memory copies",
    "memset": "memsets",
    "communication": "communication (NCCL)",
    "runtime": "CUDA runtime calls",
    "dataloader": "data-loader wait",
    "cpu_exec": "CPU ops",
    "other": "other",
}

#: GPU idle gaps by cause (docs/metrics.md ``idle.gaps[].cause``).
#: Colours used nowhere else (orange is the data-loader wait, vermillion a host sync, grey CPU ops).
#: Step phases (``metrics.phases``), in loop order.
#: Paul Tol's muted scheme (indigo, sand, olive) beside the data-loader orange, so that no phase
#: shares a colour with a lane's kernels, copies or memsets on the timeline.
PHASE_COLOR = {"data": ORANGE, "forward": "#332288", "backward": "#DDCC77", "optimizer": "#999933", "other": PALE_GREY}
PHASE_LABEL = {"data": "data (waiting for the batch)", "forward": "forward", "backward": "backward",
               "optimizer": "optimizer", "other": "other host work"}

#: Critical-path link kinds (``metrics.critical_path``).
PATH_COLOR = {"gpu_compute": BLUE, "gpu_comm": PURPLE, "gpu_copy": GREEN, "host_launch": DARK_GREY,
              "host_compute": GREY, "data": ORANGE, "sync_wait": VERMILLION, "other": PALE_GREY}
PATH_LABEL = {"gpu_compute": "GPU compute", "gpu_comm": "GPU communication", "gpu_copy": "GPU copies and memsets",
              "host_launch": "host: launches and runtime calls", "host_compute": "host: operators and Python",
              "data": "data loading", "sync_wait": "host waiting on the GPU", "other": "GPU waits not explained"}

IDLE_COLOR = {"host_wait": WINE, "launch_latency": TEAL, "other": LIGHT_GREY}
IDLE_LABEL = {
    "host_wait": "GPU idle: waiting for the host",
    "launch_latency": "GPU idle: launch latency",
    "other": "GPU idle: other",
}

HOST_SYNC = VERMILLION
#: A highlighted finding: a black outline and hatching with no fill, visible over any colour.
HIGHLIGHT = YELLOW
HIGHLIGHT_EDGE = "#000000"
HIGHLIGHT_HATCH = "////"
