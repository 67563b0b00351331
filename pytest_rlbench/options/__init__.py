"""The ``--rl-*`` options: the table (``table``), single values (``values``), what a value names
(``checks``), the parsed set (``parsed``, built by ``parse``), and the one path from the options to the
trainer config (``trainer_config``, with a replayed baseline's work from ``replay``). Pure: nothing here
imports pytest or starts anything.
"""
