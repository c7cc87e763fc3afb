# issue 44's width-1 MoE step with the router and the pairing compiled (8444da4, edfd54a) against the code
# before them (c8c2779 in .devcarry/before: git archive c8c2779 workers orchestrator scripts), back to back on one
# card, then the kernels of the new width-1 step (scripts/profile_step.py). carry [.devcarry/pyd, .devcarry/before]
bash infra/device-setup.sh pyd > $OUT/setup.log 2>&1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
P=/tmp/spectune-venv/bin/python
W="-m scripts.verify_widths --model random:qwen3-30b-a3b:layers=24 --widths 1 --json -"
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/moe_widths.log
(PYTHONPATH=$PWD timeout -k 5 60 $P $W > $OUT/moe_width1_after.json 2>> $OUT/moe_widths.log)
(cd .devcarry/before && PYTHONPATH=$PWD timeout -k 5 60 $P $W > $OUT/moe_width1_before.json 2>> $OUT/moe_widths.log)
grep -h -A1 "width  replay" $OUT/moe_widths.log
PYTHONPATH=$PWD timeout -k 5 70 $P -m scripts.profile_step --model random:qwen3-30b-a3b:layers=24 --widths 1 --attention triton --top 45 --max-seq 512 > $OUT/profile_moe_w1.txt 2>&1
tail -50 $OUT/profile_moe_w1.txt
