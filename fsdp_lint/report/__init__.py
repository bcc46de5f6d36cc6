"""`report`: rendering only. `text` (full, concise, the tables), `machine` (JSON, SARIF, GitHub),
`html`, `diagram` (``--layout diagram``) and `granularity` (``--compare-granularity``)."""
