"""``gpumagic mcp``: serve the Model Context Protocol over standard input and output.

The tools (:mod:`gpumagic.shells.mcp_server`) analyse traces, compare runs and read the run
history for a coding agent; the MCP client starts this command and owns its standard streams.
Without the MCP SDK: one line naming ``pip install 'gpumagic[mcp]'``, exit status 2.
"""

from __future__ import annotations

import argparse
import sys


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``mcp`` to ``subparsers`` (from ``ArgumentParser.add_subparsers``); returns it."""
    p = subparsers.add_parser(
        "mcp", help="serve the Model Context Protocol over stdio (tools for coding agents; needs gpumagic[mcp])",
        description="Serve gpumagic's analyses as Model Context Protocol tools over standard input and output: "
                    "analyze_trace, analyze_job, compare_runs, list_runs, show_run, explain_finding. "
                    "Start it from an MCP client; nothing is opened but the two standard streams.")
    p.set_defaults(handler=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Serve until the client closes standard input; 2 with one stderr line when the SDK is missing."""
    from gpumagic.shells import mcp_server

    if not mcp_server.sdk_available():
        print(f"gpumagic: error: {mcp_server.MCP_INSTALL_HINT}", file=sys.stderr)
        return 2
    mcp_server.serve()
    return 0
