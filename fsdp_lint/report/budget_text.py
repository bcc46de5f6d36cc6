"""`budget_text`: the memory budget and ``--suggest``'s candidates as text (``report.text`` shows them
under the plan)."""
from __future__ import annotations

from fsdp_lint.humanize import human_bytes


def budget_line(res) -> str:
    b = getattr(res, "budget", None)
    if b is None:
        return ""
    verdict = {True: "fits", False: "does not fit", None: "lower bound only: pass --input-shape for the peak"}[b.fits]
    return (f"memory budget: {human_bytes(b.peak_bytes)}/rank ({b.source}) of {human_bytes(b.usable_bytes)} usable on "
            f"{b.device}: {verdict} (headroom {human_bytes(b.headroom_bytes)})")


def suggestions_table(res) -> str:
    rows = []
    simulated = any(c.get("simulated_peak_bytes") is not None for c in res.suggestions)
    hsdp = any(c.get("all_reduce_bytes_per_step") for c in res.suggestions)
    for c in res.suggestions:
        fits = {True: "yes", False: "no", None: "?"}[c["fits"]]
        row = [fits, human_bytes(c["peak_bytes"])]
        if simulated:
            row.append(human_bytes(c["simulated_peak_bytes"]) if c.get("simulated_peak_bytes") is not None else "-")
        row += [human_bytes(c["all_gather_bytes_per_step"]), human_bytes(c["reduce_scatter_bytes_per_step"])]
        if hsdp:
            row.append(human_bytes(c.get("all_reduce_bytes_per_step", 0)))
        rows.append(row + [c["change"]])
    head = budget_line(res)
    from fsdp_lint.report.width import fitted

    headers = ["fits", "peak/rank"] + (["simulated"] if simulated else []) + ["all-gather/step",
                                                                             "reduce-scatter/step"]
    headers += (["all-reduce/step"] if hsdp else []) + ["change"]
    table = fitted(rows, headers, wrap=("change",))
    return (head + "\n" if head else "") + "--suggest (static estimates, those that fit first, least communication " \
        "first):\n" + table
