"""Studies: a spec in ablations/ -> validated runs (`load_study`), what they will cost (`study plan`),
and the DVC pipeline that reproduces them (`study sync`).

    specyaml.py    reading a spec file: strict, bounded YAML
    spec.py        the spec schema, bases and profiles, design points -> RunConfigs, report-hint checks
    searchspec.py  the `search:` block's schema (light: spec validation must not import optuna)
    cost.py        tokens, parameters and measured step times for `study plan`
    sync.py        the active studies -> dvc.yaml

Entry points load on first use (study/lazy.py).
"""

from study.lazy import exports

__all__ = ["load_study"]
__getattr__ = exports(__name__, {"load_study": "study.studies.spec"})
