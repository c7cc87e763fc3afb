# One device call (nvidia-h200), carry [".devcarry/ray", ".devcarry/rest", ".devcarry/old"], where
# .devcarry/old = `git archive e8d94cf workers orchestrator infra pyproject.toml` (the code before the
# workers/ move and the engine config). Old and new alternate, same prompts, same machine.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
bash infra/device-setup.sh > $OUT/setup.txt 2>&1
PY=/tmp/spectune-venv/bin/python
D="decode --model random:llama-3-8b --tp 1 --drafter none -k 0 --device cuda --category writing --num-prompts 4 --max-new-tokens 128 --json"
for i in 1 2; do
  (cd .devcarry/old && PYTHONPATH=$PWD timeout 150 python3 -m orchestrator $D > $OUT/tp1_old_$i.json 2>>$OUT/tp1.log)
  P=""; [ $i = 2 ] && P=--peer-baseline
  timeout 200 $PY -m orchestrator $D $P > $OUT/tp1_new_$i.json 2>>$OUT/tp1.log
done
timeout 200 $PY -m pytest -q -p no:cacheprovider tests/test_kernels_attention.py tests/test_kernels_gemv.py tests/test_triton_kernels.py > $OUT/kernels.txt 2>&1
