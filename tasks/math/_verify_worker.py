"""Worker process for :class:`~selfcest_env.tasks.math.verifier.MathVerifier` (not a public API).

Reads JSON lines ``{"id", "gold", "pred", "pred_raw"}`` on stdin and writes ``{"id", "equal"}``
or ``{"id", "error"}`` on stdout. Anything else that would go to stdout is sent to stderr, so the
protocol stream stays clean. The parent enforces the deadline by killing this process.
"""

from __future__ import annotations

import json
import logging
import sys


def main() -> None:
    """Serve comparisons until stdin closes."""
    out = sys.stdout
    sys.stdout = sys.stderr
    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    from selfcest_env.tasks.math.verifier import verify_inline

    verify_inline("1", "1", False)  # warm up: import sympy and the LaTeX parser now
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        try:
            reply = {
                "id": req["id"],
                "equal": verify_inline(req["gold"], req["pred"], req["pred_raw"]),
            }
        except Exception as e:  # any failure is reported to the parent, which scores it 0
            reply = {"id": req.get("id"), "error": f"{type(e).__name__}: {e}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
