// The training configuration. Every key is declared exactly once, in the lists below (section,
// name, type, default, help); the structs, the TOML/--set parser, the --help listing and the
// effective-config dump that rank 0 prints are all generated from them, so they cannot drift.
// A key's allowed values (choices, ranges) are one line in config_constraint.cpp's table, which
// validate() and --help-config both read, so a help text here need not repeat them.
// Sources, later wins: defaults < TOML file < `--set section.key=value` overrides.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

// X(section, name, type, default, help)
#define MESHTRAIN_CONFIG_MODEL(X)                                                              \
  X(model, kind, std::string, "gpt",                                                           \
    "model family: the GPT language model, or the MLP classifier")                             \
  X(model, n_layer, int64_t, 4, "transformer blocks")                                          \
  X(model, n_head, int64_t, 4, "attention heads per block")                                    \
  X(model, n_embd, int64_t, 128, "embedding width C (divisible by n_head)")                    \
  X(model, block_size, int64_t, 128, "context length T")                                       \
  X(model, vocab_size, int64_t, 257, "vocabulary size V (257 = bytes + end-of-text)")          \
  X(model, dropout, double, 0.0, "dropout probability")                                        \
  X(model, bias, bool, true, "biases in Linear and LayerNorm layers")                          \
  X(model, tie_embeddings, bool, true, "share the token embedding with the output projection") \
  X(model, activation_checkpointing, std::string, "none",                                      \
    "blocks recomputed in backward instead of keeping their activations: none, all, every:N, " \
    "or block indices like \"0,2\"")                                                           \
  X(model, mlp_hidden, std::string, "64,64",                                                   \
    "model.kind = mlp: the hidden layers' widths, comma-separated")                            \
  X(model, resnet, std::string, "small", "model.kind = resnet: which ResNet")                  \
  X(model, sync_batch_norm, bool, false,                                                       \
    "normalise over every data-parallel rank's batch together (SyncBatchNorm)")

// Keys of a group inside a section, G(section, group, name, type, default, help): the key
// "section.group.name" (a [section.group] table in TOML), the member group_name of the section's
// struct.
#define MESHTRAIN_CONFIG_MODEL_MOE(G)                                                              \
  G(model, moe, every, int64_t, 0,                                                                 \
    "every N-th block's MLP is a mixture of experts (blocks N-1, 2N-1, ...; 0 = none)")            \
  G(model, moe, num_experts, int64_t, 8, "experts per mixture-of-experts block")                   \
  G(model, moe, top_k, int64_t, 1, "experts each token is routed to (1: Switch, 2: GShard)")       \
  G(model, moe, expert_hidden, int64_t, 0, "hidden features of each expert's MLP (0: 4 x n_embd)") \
  G(model, moe, capacity_factor, double, 1.25,                                                     \
    "training: tokens an expert takes, as a multiple of an even share (with drop_tokens)")         \
  G(model, moe, eval_capacity_factor, double, 2.0, "evaluation: the same")                         \
  G(model, moe, min_capacity, int64_t, 4, "an expert's capacity is at least this many tokens")     \
  G(model, moe, drop_tokens, bool, true,                                                           \
    "drop assignments past an expert's capacity (false: dropless, every token is computed)")       \
  G(model, moe, aux_loss_weight, double, 0.01, "weight of the Switch load-balancing loss")         \
  G(model, moe, z_loss_weight, double, 0.001, "weight of the router z-loss (ST-MoE)")              \
  G(model, moe, grouped_experts, bool, true,                                                       \
    "run this rank's experts as one grouped operation: products built for any row count, side "    \
    "by side over the threads when small (false: each expert's MLP in turn)")                      \
  G(model, moe, router_balance, std::string, "none",                                               \
    "training: balance each micro-batch's choice of experts by per-expert offsets on the scores "  \
    "found for that batch (the gates stay the router's probabilities)")                            \
  G(model, moe, bias_update_rate, double, 0.0,                                                     \
    "auxiliary-loss-free balancing: each step a per-expert bias on the scores the experts are "    \
    "chosen by moves this much toward an even load (the gates are never biased)")                  \
  G(model, moe, router_noise, std::string, "none",                                                 \
    "training noise on the router (jitter: its inputs times U(1 - eps, 1 + eps); rsample: Gumbel " \
    "noise on the choice of experts, not on the gates)")                                           \
  G(model, moe, jitter_eps, double, 0.01, "router_noise = jitter: eps")

#define MESHTRAIN_CONFIG_DATA(X)                                                          \
  X(data, kind, std::string, "tokens",                                                    \
    "what trains: token shards (data.dir), a generated set, or images (data.image_dir)")  \
  X(data, dir, std::string, "data/fortunes", "directory with train_*.bin, val_*.bin")     \
  X(data, image_dir, std::string, "/usr/share/datasets/fashion-mnist",                    \
    "fashion_mnist: directory with the IDX files (train-*, t10k-*)")                      \
  X(data, batch_size, int64_t, 8, "sequences per rank per step (B)")                      \
  X(data, seed, int64_t, 1337, "seed of the data order")                                  \
  X(data, shard_block, int64_t, 0,                                                        \
    "tokens: shuffle shards in blocks of this many, windows within a block only (0: all " \
    "windows together); with data.dir = s3://... shards are then fetched as needed")      \
  X(data, prefetch_shards, int64_t, 2,                                                    \
    "data.shard_block > 0 on object storage: shards fetched ahead of the block read")     \
  X(data, cache_limit, std::string, "off",                                                \
    "data.shard_block > 0 on object storage: most the host's dataset cache holds (e.g. "  \
    "\"50GiB\"); least recently used shards are evicted")                                 \
  X(data, val_batches, int64_t, 8, "batches per evaluation")                              \
  X(data, samples, int64_t, 4096, "spirals: training samples (validation: 1/8 as many)")  \
  X(data, classes, int64_t, 3, "spirals: classes (spiral arms)")                          \
  X(data, crop_padding, int64_t, 4,                                                       \
    "images, training: zero pixels added on every side before a random crop (0: none)")   \
  X(data, horizontal_flip, bool, true, "images, training: random left-right mirror")

#define MESHTRAIN_CONFIG_OPTIM(X)                                                         \
  X(optim, name, std::string, "adamw", "optimizer")                                       \
  X(optim, lr, double, 1e-3, "peak learning rate")                                        \
  X(optim, weight_decay, double, 0.1, "decoupled weight decay (matrices only)")           \
  X(optim, beta1, double, 0.9, "AdamW first-moment decay")                                \
  X(optim, beta2, double, 0.95, "AdamW second-moment decay")                              \
  X(optim, eps, double, 1e-8, "AdamW denominator epsilon")                                \
  X(optim, momentum, double, 0.9, "SGD momentum")                                         \
  X(optim, nesterov, bool, false, "SGD Nesterov momentum")                                \
  X(optim, grad_clip, double, 1.0, "clip the global gradient norm to this (0 = off)")     \
  X(optim, schedule, std::string, "cosine",                                               \
    "learning-rate decay after warm-up (one_cycle: PyTorch's OneCycleLR, no warm-up)")    \
  X(optim, warmup_steps, int64_t, 20, "linear warm-up steps")                             \
  X(optim, min_lr_ratio, double, 0.1, "final learning rate as a fraction of lr")          \
  X(optim, pct_start, double, 0.3, "one_cycle: fraction of the steps spent rising to lr") \
  X(optim, lr_scale_rule, std::string, "none", "scale lr with the global batch")

#define MESHTRAIN_CONFIG_TRAIN(X)                                                                 \
  X(train, steps, int64_t, 300, "optimizer steps")                                                \
  X(train, eval_interval, int64_t, 50, "evaluate every N steps (0 = only at the end)")            \
  X(train, log_interval, int64_t, 10, "log every N steps")                                        \
  X(train, seed, int64_t, 1337, "seed of initialisation and dropout")                             \
  X(train, label_smoothing, double, 0.0,                                                          \
    "classification: weight of the uniform target in the cross-entropy (0 = off)")                \
  X(train, threads, int64_t, 0, "CPU threads per rank (0 = all cores)")                           \
  X(train, device, std::string, "cpu", "where the model trains (cuda: device LOCAL_RANK)")        \
  X(train, tf32, bool, false, "on cuda, f32 matrix products may use TF32 tensor cores")           \
  X(train, out_dir, std::string, "runs/demo", "run directory (logs, metrics, weights)")           \
  X(train, save_weights, bool, true, "write the final weights as safetensors")                    \
  X(train, sample_tokens, int64_t, 200, "tokens to sample after training (0 = none)")             \
  X(train, grad_accum_steps, int64_t, 1,                                                          \
    "micro-batches per optimizer step (no_sync on all but the last)")                             \
  X(train, trace, std::string, "", "write a Chrome/Perfetto trace here ({rank} = rank)")          \
  X(train, gemm, std::string, "onednn",                                                           \
    "library of the CPU matrix products (oneDNN picks kernels for this CPU at run time)")         \
  X(train, kernel_times, bool, false,                                                             \
    "time the CPU kernels by kind (GEMM, attention, element-wise, optimizer) into each step's "   \
    "row, with the time outside them")                                                            \
  X(train, metrics_port, int64_t, -1,                                                             \
    "serve /metrics on port + LOCAL_RANK (-1: MESHTRAIN_METRICS_PORT or off; 0: any)")            \
  X(train, metrics_host, std::string, "127.0.0.1", "address the /metrics endpoint binds")         \
  X(train, peak_flops, double, 0.0, "peak FLOP/s of one rank's device for MFU (0 = off)")         \
  X(train, log_format, std::string, "text", "progress lines (text: time, rank, step)")            \
  X(train, rollback_after, int64_t, 0,                                                            \
    "roll back to the last checkpoint after N consecutive non-finite steps (0 = off)")            \
  X(train, max_rollbacks, int64_t, 3, "rollbacks allowed in one run before it stops")             \
  X(train, rollback_skip_data, bool, true,                                                        \
    "after a rollback, skip the batches of the steps that caused it")                             \
  X(train, rollback_lr_factor, double, 1.0,                                                       \
    "multiply the learning rate by this after each rollback (1 = unchanged)")                     \
  X(train, spike_zscore, double, 0.0,                                                             \
    "skip a step whose loss or gradient norm is this many standard deviations above the recent "  \
    "window's mean (0 = off)")                                                                    \
  X(train, spike_window, int64_t, 100, "accepted steps the spike detector compares against")      \
  X(train, log_layer_norms, bool, false,                                                          \
    "per-layer gradient norms in metrics.jsonl (layer_grad_norms) and as "                        \
    "meshtrain_layer_grad_norm{layer}")                                                           \
  X(train, precision, std::string, "f32",                                                         \
    "matrix-product precision (autocast: f32 master weights, inputs rounded, f32 "                \
    "accumulation; f16 adds dynamic loss scaling)")                                               \
  X(train, loss_scale_init, double, 65536.0, "f16: initial loss scale")                           \
  X(train, loss_scale_growth_factor, double, 2.0, "f16: scale growth after a finite interval")    \
  X(train, loss_scale_backoff_factor, double, 0.5, "f16: scale factor after a non-finite step")   \
  X(train, loss_scale_growth_interval, int64_t, 2000, "f16: finite steps in a row before growth") \
  X(train, max_memory, std::string, "auto",                                                       \
    "per-rank memory the engine may plan for before the first step: auto (what the host or "      \
    "cgroup has free), off, or a size like 8GiB / 512MiB")

#define MESHTRAIN_CONFIG_DIST(X)                                                              \
  X(dist, backend, std::string, "auto", "collectives backend (auto: by host layout)")         \
  X(dist, timeout_s, double, 300.0, "deadline of every collective, seconds")                  \
  X(dist, bucket_mb, double, 25.0, "gradient bucket size, MiB")                               \
  X(dist, first_bucket_mb, double, 1.0, "first (last-layer) gradient bucket size, MiB")       \
  X(dist, broadcast_buffers, bool, true,                                                      \
    "every step starts from rank 0's buffers (running statistics), as PyTorch DDP")           \
  X(dist, find_unused_parameters, bool, false, "reduce parameters without gradient as zeros") \
  X(dist, comm_hook, std::string, "allreduce",                                                \
    "gradient communication hook (plain all-reduce or a compression)")                        \
  X(dist, gradient_as_bucket_view, bool, true,                                                \
    "parameter gradients are views into the all-reduce buckets (no copy back)")               \
  X(dist, shared_buckets, bool, true,                                                         \
    "CPU gradient buckets in memory a host's ranks share (shm reduces in place)")             \
  X(dist, check_interval, int64_t, 100,                                                       \
    "compare parameter checksums across ranks every N steps (0 = off)")                       \
  X(dist, elastic_batch, std::string, "keep",                                                 \
    "on resuming at another world size: keep the global batch (via "                          \
    "train.grad_accum_steps), or rescale_lr (keep accumulation, lr per optim.lr_scale_rule)") \
  X(dist, tls, bool, false,                                                                   \
    "TLS 1.3, mutual certificates, on the store and tcp collectives (or MESHTRAIN_TLS)")      \
  X(dist, tls_cert, std::string, "", "this node's certificate (else MESHTRAIN_TLS_CERT)")     \
  X(dist, tls_key, std::string, "", "private key of dist.tls_cert (else MESHTRAIN_TLS_KEY)")  \
  X(dist, tls_ca, std::string, "",                                                            \
    "CA certificate every peer's must chain to, PEM (else MESHTRAIN_TLS_CA)")

#define MESHTRAIN_CONFIG_PARALLEL(X)                                                              \
  X(parallel, zero_stage, int64_t, 0,                                                             \
    "ZeRO over the dp dimension: 0 (DDP), 1 (optimizer state sharded), 2 (and gradients), "       \
    "3 (and parameters: FSDP)")                                                                   \
  X(parallel, fsdp_unit, std::string, "block",                                                    \
    "zero_stage 3: what is gathered at a time: block (one transformer block) or model")           \
  X(parallel, pp, int64_t, 1,                                                                     \
    "pipeline-parallel degree: stages over the pp dimension (dp = world / (pp x tp))")            \
  X(parallel, tp, int64_t, 1,                                                                     \
    "tensor-parallel degree: ranks that split each layer's matrices (Megatron), with or "         \
    "without pp; dp = world / (pp x tp); CPU, f32, ZeRO 0-2")                                     \
  X(parallel, sequence_parallel, bool, false,                                                     \
    "split norms, dropout and residuals along the sequence over tp (needs tp > 1)")               \
  X(parallel, schedule, std::string, "1f1b",                                                      \
    "pipeline schedule: gpipe, 1f1b, interleaved "                                                \
    "(used with pp > 1)")                                                                         \
  X(parallel, micro_batches, int64_t, 0,                                                          \
    "pipeline micro-batches per step, dividing data.batch_size x train.grad_accum_steps "         \
    "(0: one per accumulation step; without a pipeline 0 or 1)")                                  \
  X(parallel, partition, std::string, "flops",                                                    \
    "what the pipeline's cut into stages balances: flops (forward and backward per token) "       \
    "or params")                                                                                  \
  X(parallel, virtual_stages, int64_t, 1, "interleaved schedule: model chunks per pipeline rank") \
  X(parallel, ep, int64_t, 1,                                                                     \
    "expert-parallel degree: the MoE experts shared out over groups of ep neighbouring "          \
    "data-parallel ranks, tokens exchanged by all-to-all (divides dp and model.moe.num_experts)") \
  X(parallel, mode, std::string, "ddp",                                                           \
    "how data-parallel replicas agree: ddp (all-reduce, with ZeRO, pp and tp), "                  \
    "parameter_server (servers hold parameters and optimizer), gossip (neighbour averaging)")

// parallel.mode = "parameter_server": the last parallel.ps.servers ranks of the job are servers.
#define MESHTRAIN_CONFIG_PARALLEL_PS(G)                                                         \
  G(parallel, ps, servers, int64_t, 1,                                                          \
    "server ranks (the job's last ones), holding the parameters and optimizer state in key "    \
    "ranges balanced by bytes")                                                                 \
  G(parallel, ps, consistency, std::string, "sync",                                             \
    "sync (every step waits for every gradient), async (applied as they come), ssp (async, a "  \
    "worker at most ps.staleness steps ahead of the slowest)")                                  \
  G(parallel, ps, staleness, int64_t, 3, "ssp: steps a worker may run ahead of the slowest")    \
  G(parallel, ps, backup_workers, int64_t, 0,                                                   \
    "sync: each step applies the first workers - b gradients; late ones are dropped and their " \
    "batches trained again")                                                                    \
  G(parallel, ps, staleness_lr, bool, false,                                                    \
    "async and ssp: scale each gradient's learning rate by 1 / (1 + its staleness)")

// parallel.mode = "gossip".
#define MESHTRAIN_CONFIG_PARALLEL_GOSSIP(G) \
  G(parallel, gossip, graph, std::string, "ring", "who averages with whom each step")

#define MESHTRAIN_CONFIG_ELASTIC(X)                                                              \
  X(elastic, straggler_factor, double, 2.0,                                                      \
    "a rank whose steps take this many times the median rank's is a straggler (0 = off)")        \
  X(elastic, straggler_steps, int64_t, 20, "consecutive slow steps before a straggler is named") \
  X(elastic, drop_stragglers, bool, false,                                                       \
    "with meshrun --nnodes MIN:MAX: a named straggler's node is left out at the next "           \
    "rendezvous and the job goes on smaller from its last checkpoint")

#define MESHTRAIN_CONFIG_CKPT(X)                                                                 \
  X(ckpt, dir, std::string, "",                                                                  \
    "checkpoint root, or s3://bucket/prefix (empty = <train.out_dir>/checkpoints, which is the " \
    "local staging copy with s3://)")                                                            \
  X(ckpt, interval, int64_t, 0, "checkpoint every N steps and at the end (0 = off)")             \
  X(ckpt, interval_minutes, double, 0.0,                                                         \
    "also checkpoint once this many minutes passed since the last save (0 = off; rank 0's "      \
    "clock decides, every rank saves at the same step)")                                         \
  X(ckpt, keep_last, int64_t, 3, "keep the newest K checkpoints (0 = all)")                      \
  X(ckpt, keep_every, int64_t, 0, "also keep every M-th step (0 = none)")                        \
  X(ckpt, async, bool, true, "write checkpoints on a background thread")                         \
  X(ckpt, resume, bool, true, "continue from the newest good checkpoint when there is one")      \
  X(ckpt, max_snapshot_mb, double, 8192.0, "host memory for an async snapshot, MiB (else sync)") \
  X(ckpt, on_error, std::string, "stop",                                                         \
    "what a failed save (disk full, I/O error) does (stop: exit non-zero)")                      \
  X(ckpt, keep_best, bool, false,                                                                \
    "also save at each new best validation loss, keep it apart from keep_last/keep_every and "   \
    "point <ckpt.dir>/best at it")                                                               \
  X(ckpt, resume_from, std::string, "latest",                                                    \
    "what ckpt.resume continues from (latest: the newest good checkpoint)")

#define MESHTRAIN_CONFIG_KEYS(X) \
  MESHTRAIN_CONFIG_MODEL(X)      \
  MESHTRAIN_CONFIG_DATA(X)       \
  MESHTRAIN_CONFIG_OPTIM(X)      \
  MESHTRAIN_CONFIG_TRAIN(X)      \
  MESHTRAIN_CONFIG_DIST(X)       \
  MESHTRAIN_CONFIG_PARALLEL(X) MESHTRAIN_CONFIG_ELASTIC(X) MESHTRAIN_CONFIG_CKPT(X)

// Every key of a group, G(section, group, name, type, default, help).
#define MESHTRAIN_CONFIG_GROUP_KEYS(G) \
  MESHTRAIN_CONFIG_MODEL_MOE(G) MESHTRAIN_CONFIG_PARALLEL_PS(G) MESHTRAIN_CONFIG_PARALLEL_GOSSIP(G)

namespace meshtrain::runtime {

#define MESHTRAIN_CONFIG_MEMBER(section, name, type, def, help) type name = def;
#define MESHTRAIN_CONFIG_GROUP_MEMBER(section, group, name, type, def, help) \
  type group##_##name = def;

struct ModelConfig {
  MESHTRAIN_CONFIG_MODEL(MESHTRAIN_CONFIG_MEMBER)
  MESHTRAIN_CONFIG_MODEL_MOE(MESHTRAIN_CONFIG_GROUP_MEMBER)
};

struct DataConfig {
  MESHTRAIN_CONFIG_DATA(MESHTRAIN_CONFIG_MEMBER)
};
struct OptimConfig {
  MESHTRAIN_CONFIG_OPTIM(MESHTRAIN_CONFIG_MEMBER)
};
struct LoopConfig {
  MESHTRAIN_CONFIG_TRAIN(MESHTRAIN_CONFIG_MEMBER)
};
struct DistConfig {
  MESHTRAIN_CONFIG_DIST(MESHTRAIN_CONFIG_MEMBER)
};
struct ParallelConfig {
  MESHTRAIN_CONFIG_PARALLEL(MESHTRAIN_CONFIG_MEMBER)
  MESHTRAIN_CONFIG_PARALLEL_PS(MESHTRAIN_CONFIG_GROUP_MEMBER)
  MESHTRAIN_CONFIG_PARALLEL_GOSSIP(MESHTRAIN_CONFIG_GROUP_MEMBER)
};
struct ElasticConfig {
  MESHTRAIN_CONFIG_ELASTIC(MESHTRAIN_CONFIG_MEMBER)
};
struct CkptConfig {
  MESHTRAIN_CONFIG_CKPT(MESHTRAIN_CONFIG_MEMBER)
};

#undef MESHTRAIN_CONFIG_GROUP_MEMBER
#undef MESHTRAIN_CONFIG_MEMBER

struct TrainConfig {
  ModelConfig model;
  DataConfig data;
  OptimConfig optim;
  LoopConfig train;
  DistConfig dist;
  ParallelConfig parallel;
  ElasticConfig elastic;
  CkptConfig ckpt;
};

enum class ConfigType { kInt, kFloat, kBool, kString };
std::string_view config_type_name(ConfigType type);  // "integer", "float", "boolean", "string"

using ConfigRef = std::variant<int64_t*, double*, bool*, std::string*>;

struct ConfigKey {
  std::string_view section;  // "model"
  std::string_view name;     // "n_layer" ("moe.every" for a key of a group)
  std::string_view key;      // "model.n_layer"
  ConfigType type;
  std::string_view help;
  ConfigRef (*ref)(TrainConfig&);
};

// Every key, in declaration order.
const std::vector<ConfigKey>& config_schema();
// nullptr when unknown.
const ConfigKey* find_config_key(std::string_view key);
// The closest known key by edit distance, or "" when nothing is close.
std::string suggest_config_key(std::string_view unknown);

// Defaults, then the TOML file (skipped when path is empty), then "key=value" overrides, then
// validate(). Missing file: IoError. Unknown key, wrong type, bad value: ValueError naming it.
TrainConfig load_config(const std::string& path, const std::vector<std::string>& overrides = {});
// Applies one "section.key=value" override; `value` is parsed according to the key's type.
void apply_override(TrainConfig& config, std::string_view assignment);
// Checks every key and combination: resolve_config (resolved_config.h), its result dropped.
void validate(const TrainConfig& config);
// train.max_memory (or another size key) in bytes; nullopt for "auto" and "off" (ValueError for
// anything else that is not a positive size with a unit: B, KiB, MiB, GiB, TiB, KB, MB, GB, TB).
std::optional<uint64_t> parse_memory_limit(const std::string& text,
                                           std::string_view key = "train.max_memory");

// The value as TOML would write it ("4", "0.001", "true", "\"adamw\"").
std::string config_value_str(const TrainConfig& config, const ConfigKey& key);
std::string to_toml(const TrainConfig& config);
nlohmann::ordered_json to_json(const TrainConfig& config);
// Inverse of to_json (for a config stored in a checkpoint), with the same checks as TOML.
TrainConfig config_from_json(const nlohmann::json& json);
// xxh3 of to_toml(): equal on two ranks exactly when their effective configs are equal.
uint64_t config_hash(const TrainConfig& config);
// One line per key: "  model.n_layer = 4  (integer) transformer blocks".
std::string config_help();

}  // namespace meshtrain::runtime
