"""EAGLE-3: the head, its format and the drafter (`head`), the greedy chain as a CUDA graph
(`chain`), a draft tree's shape (`tree`), reading and writing heads (`checkpoint`) and training
(`training`). The shipped demo head: `heads/`."""
