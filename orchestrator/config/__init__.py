"""Configuration: the experiment YAML as typed pydantic models (`schema`), `TrialConfig` and the
registry of searchable parameters, derived from their declarations (`registry`), a trial -> TrialConfig
(`space`, pure), the part of a study a
resume must keep (`fixed`), emulated TP's settings (`emulation`) and the environment policy every
GPU process starts with (`envpolicy`). Nothing here starts Ray, touches storage or loads a model."""
