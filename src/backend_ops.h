/* backend_ops.h — the compute ops of struct backend, listed once. Each entry is
 *
 *     BACKEND_OP(name, family, (parameters), (arguments after be))
 *
 * and a user defines BACKEND_OP, includes this file, and undefines it again, so one list makes
 * the struct backend members (backend.h), enum backend_op and the op names (backend.h), the
 * CPU and CUDA tables (be->name = cpu_name / cuda_name), the CUDA prototypes, the op-cost
 * forwarders (opcost.c; family is the op's enum opcost_family without the OPCOST_ prefix,
 * MATMUL meaning "by the weights' shape") and the op tests' registry (tests/cuda/test_cuda_ops.c
 * fails for an op without a test). No include guard on purpose. Every op returns void.
 *
 * Adding an op: an entry here, cpu_<name> in cpu/backend_cpu.c, cuda_<name> in src/cuda, a
 * test in test_cuda_ops.c's registry. The memory, weight, timing and graph members of struct
 * backend are not ops and stay in backend.h. */

/* ys[i][t][0..n_out) = ws[i] · (row t of the input `in` forms) for n_tok rows, every weight
 * n_in wide (struct matmul_in: a plain input, or a norm / gate / activation formed on the way,
 * which backends fuse into the matmul where they can). */
BACKEND_OP(matmul, MATMUL,
           (struct backend *be, const struct bweight *const *ws, float *const *ys, int n_w,
            const struct matmul_in *in, int n_tok),
           (ws, ys, n_w, in, n_tok))
/* out[t] = row ids[t] of w, dequantized (embedding lookup). */
BACKEND_OP(get_rows, EMBED, (struct backend *be, const struct bweight *w, const int32_t *ids, int n, float *out),
           (w, ids, n, out))

/* y = x / sqrt(mean(x²) + eps) ⊙ w for n_rows rows of dim elements (strides per row). */
BACKEND_OP(rmsnorm, NORMS,
           (struct backend *be, const float *x, int x_stride, const float *w, int n_rows, int dim, float eps,
            float *y, int y_stride),
           (x, x_stride, w, n_rows, dim, eps, y, y_stride))
/* y = rmsnorm(x) ⊙ w ⊙ silu(z) per row of dim (delta-net gated output norm). */
BACKEND_OP(rmsnorm_gated, NORMS,
           (struct backend *be, const float *x, const float *w, const float *z, int n_rows, int dim, float eps,
            float *y),
           (x, w, z, n_rows, dim, eps, y))
/* x += m, then y = rmsnorm(x) ⊙ w (rows of dim, contiguous): a residual add and the norm that
 * reads its result, in one op (one pass on devices where each op is a launch). */
BACKEND_OP(add_rmsnorm, NORMS,
           (struct backend *be, float *x, const float *m, const float *w, int n_rows, int dim, float eps, float *y),
           (x, m, w, n_rows, dim, eps, y))
/* x = (x + rmsnorm(y) ⊙ w) · s (rows of dim, contiguous): a block's output normed into the
 * residual stream and scaled (gemma4's post-norms and layer scale), in one op; equal to rmsnorm,
 * add and scale in turn. */
BACKEND_OP(rmsnorm_add, NORMS,
           (struct backend *be, float *x, const float *y, const float *w, int n_rows, int dim, float eps, float s),
           (x, y, w, n_rows, dim, eps, s))
BACKEND_OP(add, ELEMENTWISE, (struct backend *be, const float *a, const float *b, int64_t n, float *y), (a, b, n, y))
/* y = silu(g) ⊙ u */
BACKEND_OP(swiglu, ELEMENTWISE, (struct backend *be, const float *g, const float *u, int64_t n, float *y),
           (g, u, n, y))
/* y = gelu(g) ⊙ u, gelu by its tanh approximation (GeGLU) */
BACKEND_OP(geglu, ELEMENTWISE, (struct backend *be, const float *g, const float *u, int64_t n, float *y),
           (g, u, n, y))
/* x[0, n) = the sum over the ranks of a tensor-parallel split (be->comm, tp.h) of their x, the
 * same bits on every rank; nothing with one rank (comm NULL). Follows the matmuls whose input
 * is split across ranks (attention and delta-net outputs, FFN down). supports(all_reduce):
 * whether the backend can be a rank of a split of several. */
BACKEND_OP(all_reduce, ELEMENTWISE, (struct backend *be, float *x, int64_t n), (x, n))
/* x *= s, in place */
BACKEND_OP(scale, ELEMENTWISE, (struct backend *be, float *x, int64_t n, float s), (x, n, s))
/* x = c · tanh(x / c), in place (final logit soft-capping) */
BACKEND_OP(softcap, ELEMENTWISE, (struct backend *be, float *x, int64_t n, float c), (x, n, c))
/* x[t][h*dim + i] *= sigmoid(gate[t*gate_stride + h*gate_head_stride + i]) */
BACKEND_OP(mul_sigmoid, ROPE_KV,
           (struct backend *be, float *x, const float *gate, int n_tok, int n_head, int dim, int gate_stride,
            int gate_head_stride),
           (x, gate, n_tok, n_head, dim, gate_stride, gate_head_stride))

/* NeoX rope on the first n_rot dims of each head, in place: head h of token t at
 * x + t*tok_stride + h*head_stride; angle of pair d = pos[t] · base^(-2d/n_rot) / freqs[d]
 * (freqs NULL: 1; gemma4's partial rotation divides the unrotated pairs by ~1e30). */
BACKEND_OP(rope_neox, ROPE_KV,
           (struct backend *be, float *x, int n_tok, int tok_stride, int n_head, int head_stride, int n_rot,
            const int32_t *pos, float base, const float *freqs),
           (x, n_tok, tok_stride, n_head, head_stride, n_rot, pos, base, freqs))
/* An attention block's inputs in one op (struct attn_prep_in), equal to rmsnorm of every q
 * head (n_head of the view's head_dim) with q_norm and of every k head (the view's n_head_kv)
 * with k_norm, in place; rope_neox of both; rmsnorm of every v head with v_norm when it is
 * given, in place; then kv_store of k and v into cells[t] of kv. */
BACKEND_OP(attn_prep, ROPE_KV,
           (struct backend *be, const struct attn_prep_in *in, int n_tok, const int32_t *pos, const int32_t *cells,
            const struct kv_view *kv),
           (in, n_tok, pos, cells, kv))
/* Store K and V rows (kv's n_head_kv · head_dim wide; k rows k_stride apart) into cells[t] of
 * the layer kv views, converted to its type. */
BACKEND_OP(kv_store, ROPE_KV,
           (struct backend *be, const float *k, int k_stride, const float *v, int v_stride, int n_tok,
            const int32_t *cells, const struct kv_view *kv),
           (k, k_stride, v, v_stride, n_tok, cells, kv))
/* Causal softmax attention over the layer kv views, with GQA (head h uses kv head
 * h / (n_head/kv->n_head_kv)): token t attends cells [cell0[t], cell0[t] + n_ctx[t]); q head h
 * at q + t*q_stride + h*q_head_stride; out[t][h*head_dim + i]. */
BACKEND_OP(attention, ATTENTION,
           (struct backend *be, const float *q, int q_stride, int q_head_stride, const struct kv_view *kv,
            const int32_t *cell0, const int32_t *n_ctx, int n_tok, int n_head, float scale, float *out),
           (q, q_stride, q_head_stride, kv, cell0, n_ctx, n_tok, n_head, scale, out))

/* Causal depthwise conv (kernel k) + SiLU over each run's rows (struct state_run, its states in
 * st). x and y rows are n_ch wide; w[c][k] (tap k-1 multiplies the current token); a state is
 * [c][k-1] (oldest first), a snapshot slot n_ch·(k-1) floats. */
BACKEND_OP(ssm_conv, DELTANET,
           (struct backend *be, const float *x, int n_ch, int k, const float *w, float *y, const struct state_set *st,
            const struct state_run *runs, int n_runs),
           (x, n_ch, k, w, y, st, runs, n_runs))
/* Gated delta rule over each run's rows (arch-qwen35.md §5.5). qkv rows (stride qkv_stride):
 * q heads [0, nk·dk), k heads [nk·dk, 2nk·dk), v heads after; q and k are L2-normalised here
 * (eps). The gates come raw (struct gdn_gates, rows as qkv's) and are formed here, per token
 * and v-head. A state is [h][j][i] (dk fastest), a snapshot slot nv·dk·dv floats; v head h
 * uses k head h % nk. out[row][h*dv + j]. */
BACKEND_OP(gdn, DELTANET,
           (struct backend *be, const float *qkv, int qkv_stride, const struct gdn_gates *gates, int nk, int nv, int dk,
            int dv, float eps, float *out, const struct state_set *st, const struct state_run *runs, int n_runs),
           (qkv, qkv_stride, gates, nk, nv, dk, dv, eps, out, st, runs, n_runs))
/* The same rule in its chunked (parallel) form, for long runs without snapshots (prompt
 * processing); equal to gdn up to f32 rounding (arch-qwen35.md §5.6). */
BACKEND_OP(gdn_chunked, DELTANET,
           (struct backend *be, const float *qkv, int qkv_stride, const struct gdn_gates *gates, int nk, int nv, int dk,
            int dv, float eps, float *out, const struct state_set *st, const struct state_run *runs, int n_runs),
           (qkv, qkv_stride, gates, nk, nv, dk, dv, eps, out, st, runs, n_runs))

/* Mixture-of-experts routing, per row t of logits (n_expert wide): p = softmax(row), the n_used
 * largest p in descending order (the lower index first on ties) as ids[t·n_used + k], and their
 * p divided by the sum of the n_used (the sum at least 2^-14, llama.cpp's clamp) as
 * wts[t·n_used + k]. */
BACKEND_OP(moe_route, MOE,
           (struct backend *be, const float *logits, int n_tok, int n_expert, int n_used, int32_t *ids, float *wts),
           (logits, n_tok, n_expert, n_used, ids, wts))
/* The routed experts' matmul (struct matmul_id_in): each slot's rows of its expert only, every
 * expert's weights read once per call whatever number of slots chose it; a slot's output does
 * not depend on the other slots of the call. */
BACKEND_OP(matmul_id, MOE,
           (struct backend *be, const struct bweight *w, const struct matmul_id_in *in, int n_tok, float *y),
           (w, in, n_tok, y))
/* The experts' outputs summed: out[t] = Σ_k (y[t·n_used + k] · s[ids[t·n_used + k]]) ·
 * wts[t·n_used + k] (k in order, rows of dim; s: a per-expert scale, none when exp_scale is
 * NULL) + sigmoid(gate[t]) · shared[t] (the gated shared expert; none when shared is NULL). */
BACKEND_OP(moe_sum, MOE,
           (struct backend *be, const float *y, const float *wts, const int32_t *ids, const float *exp_scale, int n_tok,
            int n_used, int dim, const float *shared, const float *gate, float *out),
           (y, wts, ids, exp_scale, n_tok, n_used, dim, shared, gate, out))

/* out[r] = index of the max of row r (lowest index on ties); if p_max, also the softmax
 * probability of that max (drafters' p_min check) — only ids and scalars leave the op. */
BACKEND_OP(argmax, ARGMAX, (struct backend *be, const float *x, int n_rows, int n, int32_t *out, float *p_max),
           (x, n_rows, n, out, p_max))
/* Greedy speculative acceptance, so a cycle needs one small download: a = the length of
 * the longest prefix with draft[i] == target[i] (i < n_draft; target[i] is the target's
 * choice after row i of the verify batch); out[0] = a and out[1 + i] = target[i] for
 * i <= n_draft — the accepted tokens are out[1 .. a], the target's own token out[1 + a]. */
BACKEND_OP(accept_greedy, ARGMAX,
           (struct backend *be, const int32_t *draft, const int32_t *target, int n_draft, int32_t *out),
           (draft, target, n_draft, out))
