"""From verdict to the line of code: a capture of a waiting GPU's workload (opt-in: ``--capture.enabled``).

- ``options.py``  the ``--capture.*`` settings
- ``stacks.py``   py-spy's raw stacks -> per-thread hotspots, labels, evidence lines, a speedscope file (pure)
- ``runner.py``   py-spy on the workload's processes with a deadline; partial results as values
- ``trigger.py``  which GPU is due: waited on one cause for ``--capture.after``, once per workload per interval
- ``take.py``     one capture: stacks, assessment of the verdict, the bundle's files
- ``bundle.py``   the bundle folder: written atomically, bounded in count and bytes
- ``stage.py``    the stage the pipeline builds when enabled: trigger, one capture at a time, its metrics
"""
