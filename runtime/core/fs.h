// Small file-system helpers shared by every writer: outputs are written to a temporary next to the
// destination and renamed into place, so a crash never leaves a half-written file under the final
// name.
#pragma once

#include <string>

namespace berth {

// A unique temporary path in the same directory as `final_path` (so rename() is atomic).
std::string temp_path_for(const std::string& final_path);

// Atomically replaces `final_path` with `temp_path` (rename). Throws Error on failure.
void commit_file(const std::string& temp_path, const std::string& final_path);

// Writes `text` to `path` atomically (temporary + rename).
void write_text_file_atomic(const std::string& path, const std::string& text);

// Reads a whole file; throws Error naming the path when it cannot be read.
std::string read_text_file(const std::string& path);

// Creates `dir` (and parents) if needed and checks that it is writable; throws Error otherwise.
void ensure_writable_dir(const std::string& dir, const char* what);

}  // namespace berth
