"""``gpufeed diagnose``: the one-shot report per GPU (:mod:`.command`), its JSON, text and exit code
(:mod:`.report`) and the JSON Schema it is published under (``report.schema.json``, its enums written by
:mod:`exporter.schemas`)."""
