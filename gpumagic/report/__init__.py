"""The report layer: what the user holds (Report, Finding); renderers live in gpumagic.render."""

from gpumagic.report.model import Evidence, Finding, Fix, Report, Window

__all__ = ["Evidence", "Finding", "Fix", "Report", "Window"]
