//! Flows whose index phase runs in passes on the GPU: reductions and a softmax over pages in
//! four stages, and state of two fields.

/// Four stages: each page's score against the sequence's mean, its spread and its range.
pub const SPREAD: &str = "flow spread \"scores against the sequence's spread\"
page centroid[1, D] bf16
cache:
  centroid = mean(K, rows)
index:
  s = max(dot(q, centroid), rows)
  c = s - mean(s, pages)
  z = c / (norm(c, pages) + 1)
  w = softmax(z * 8, pages)
  topk(w + (max(s, pages) - min(s, pages)) * sum(w, pages) * 0.001)
";

/// Two states, one of two columns; a save reads the other state as it was before the step.
pub const DECAY: &str = "flow decay \"decayed attention mass and how much of it was seen\"
page centroid[1, D] bf16
state mass[1, 2]
state seen[1, 1]
cache:
  centroid = mean(K, rows)
index:
  a = softmax(dot(q, centroid) / sqrt(D), pages)
  m = load(mass)
  next = m * 0.5 + mean(a, rows)
  save(mass, next)
  save(seen, load(seen) + slice(m, cols, 1, 1))
  topk(slice(next, cols, 0, 1) + load(seen) * 0.01)
";
