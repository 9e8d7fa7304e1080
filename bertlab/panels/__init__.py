"""One Panel class per dashboard tab; `app.py` composes them under the model picker."""

import sys

# plotly's FigureWidget imports nbformat -> jsonschema, whose optional IRI format checker
# (rfc3987_syntax) compiles a grammar at import: a noticeable part of the dashboard's start, for a
# check bertlab never uses. Marking it absent makes jsonschema skip that one format.
if "rfc3987_syntax" not in sys.modules and "jsonschema" not in sys.modules:
    sys.modules["rfc3987_syntax"] = None  # type: ignore[assignment]
