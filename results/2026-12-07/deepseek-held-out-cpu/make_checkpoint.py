from workers.model.checkpoint import tiny_config, write_random_checkpoint
cfg = {k: v for k, v in tiny_config(
    model_type="deepseek_v3", architectures=["DeepseekV3ForCausalLM"], hidden_size=64, intermediate_size=96,
    num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=8, q_lora_rank=None, kv_lora_rank=16,
    qk_nope_head_dim=12, qk_rope_head_dim=8, v_head_dim=10, n_routed_experts=16, num_experts_per_tok=6,
    n_group=4, topk_group=2, moe_intermediate_size=32, first_k_dense_replace=2, routed_scaling_factor=2.5,
    norm_topk_prob=False, n_shared_experts=2, rope_theta=40000.0, num_nextn_predict_layers=1,
    rope_scaling={"type": "yarn", "factor": 2.0, "original_max_position_embeddings": 256, "mscale": 0.8, "mscale_all_dim": 0.8},
).items() if k != "head_dim"}
print(write_random_checkpoint("/tmp/ho45/ckpt", cfg, seed=45))
