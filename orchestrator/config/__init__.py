"""Configuration: the experiment YAML as typed pydantic models (`schema`), the one registry of
searchable parameters (`registry`), a trial -> TrialConfig (`space`, pure), `spectune validate`
(`validate`), the part of a study a resume must keep (`fixed`) and the environment policy every
GPU process starts with (`envpolicy`). Nothing here starts Ray or touches storage."""
