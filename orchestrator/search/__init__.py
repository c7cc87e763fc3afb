"""The search: which configuration a study measures next and which one it names. The trials'
order and standing (`ranking`: pooled repeats, noise, the clear-winner rule), the proposal rules
(`proposals`: duplicates, surplus, the simplest among ties), racing (`racing`: the last trials
re-measure the leaders, alone where hosts are shared), the samplers (`samplers`: Optuna's
and the `model` sampler), the configuration model the model sampler fits (`config_model`, on the
points of `points`) and `spectune bench-search` (`benchmark`: samplers replayed on a recorded
landscape). Reads the record through Optuna trials; starts no Ray and measures nothing."""
