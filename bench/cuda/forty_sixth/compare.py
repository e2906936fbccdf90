# Compares the prompt log-probabilities and greedy tokens of Gemma 3 270M served on the CPU (f32
# product inputs, and bf16 ones) and on the GPU: python3 compare.py (from this folder).
import gzip, json

R = {k: json.load(gzip.open(f"gemma3_270m_{k}.json.gz"))
     for k in ["cpu", "cpu_bf16_inputs", "gpu"]}
n = 1809  # prompt tokens
for f in ["dense", "block_topk"]:
    for a, b in [("cpu", "cpu_bf16_inputs"), ("cpu_bf16_inputs", "gpu"), ("cpu", "gpu")]:
        x, y = (R[k][f]["choices"][0]["logprobs"] for k in (a, b))
        d = sorted(abs(p - q) for p, q in zip(x["token_logprobs"][1:n], y["token_logprobs"][1:n]))
        first = next((i for i, (p, q) in enumerate(zip(x["tokens"][n:], y["tokens"][n:])) if p != q), None)
        print(f"{f:10s} {a:15s} vs {b:15s}: |diff| median {d[len(d) // 2]:.4f} p90 {d[int(.9 * len(d))]:.4f} "
              f"p99 {d[int(.99 * len(d))]:.4f} max {d[-1]:.4f}; first greedy token apart: {first}")
