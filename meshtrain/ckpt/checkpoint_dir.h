// The checkpoint root on disk and its naming rules, shared by the writer, the loader, retention
// and the command line:
//   ROOT/step_<N>/       a complete checkpoint (renamed into place only once durable)
//   ROOT/step_<N>.tmp/   being written, or left behind by a crash: never read
//   ROOT/latest          one line naming the step directory, replaced atomically, written last
//   ROOT/best            (ckpt.keep_best) the same for the step of the best validation loss,
//                        written after `latest` when a save is the new best
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace meshtrain::ckpt {

inline constexpr const char* kLatestFile = "latest";
inline constexpr const char* kBestFile = "best";

std::string step_dir_name(int64_t step);  // "step_<N>"
// The step of "step_<N>", or nothing for any other name (including "step_<N>.tmp").
std::optional<int64_t> parse_step_dir_name(const std::string& name);

// Steps of the complete checkpoints under root (step_<N> directories holding a manifest.json),
// ascending. A missing root has none.
std::vector<int64_t> list_complete_steps(const std::string& root);
// Directories under root whose names end in ".tmp".
std::vector<std::string> list_tmp_dirs(const std::string& root);

// The directory name `latest` holds (trimmed), or nothing when the file is absent or does not
// hold a step directory name. Says nothing about whether that directory exists.
std::optional<std::string> read_latest(const std::string& root);
// Atomically points `latest` at step_dir_name(step).
void write_latest(const std::string& root, int64_t step);
// The same for the `best` pointer.
std::optional<std::string> read_best(const std::string& root);
void write_best(const std::string& root, int64_t step);
// The step a pointer file (`latest`, `best`) names, or nothing (absent, or not a step name).
std::optional<int64_t> read_pointer_step(const std::string& root, const std::string& pointer);

// A step directory (has a manifest.json) is returned as is; a root is resolved through
// `latest`; a pointer file (ROOT/latest, ROOT/best) through what it names. IoError when none
// applies.
std::string resolve_checkpoint_dir(const std::string& dir);

// fsync on a directory, so that renames and creations inside it survive a crash. Best effort
// where the filesystem refuses (the data files themselves are always synced).
void fsync_dir(const std::string& dir);

// Removes a directory tree so that a crash midway never leaves something that looks complete:
// it is first renamed to "<name>.deleting.tmp", then removed.
void remove_dir_safely(const std::string& dir);

}  // namespace meshtrain::ckpt
