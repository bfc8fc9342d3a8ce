"""``gpufeed report``: the fleet-wide capacity review, from a Prometheus that scrapes gpufeed.

Data flow, one direction: ``collect`` (I/O: PromQL over the HTTP API, ``promapi``) builds a ``model.FleetData``
of plain numbers; ``figures`` (pure) turns it into a ``figures.Report``; ``plots``, ``page`` and ``ticket``
render that as SVG, HTML and Markdown; ``command`` is the CLI glue. Only ``plots`` needs matplotlib (the
``gpufeed[report]`` extra), so the daemon install stays lean.
"""
