# Device call right after ../tp1-workers-move-h200 (warm machine, venv in /tmp): code of 7123673
bash infra/device-setup.sh check > $OUT/log.txt 2>&1 && OUT=$OUT bash infra/gpu-study.sh experiments/h200-1gpu.yaml
