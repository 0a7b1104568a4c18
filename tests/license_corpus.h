// The quickstart's corpus (scripts/quickstart): the text files of /usr/share/common-licenses,
// which every Debian system has. Tests that train on real text use it and skip where it is absent.
#pragma once

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

namespace berth::test {

// Its files in name order; empty where the directory does not exist.
inline std::vector<std::string> license_corpus_files() {
  std::vector<std::string> files;
  const std::filesystem::path dir = "/usr/share/common-licenses";
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) return files;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    if (e.is_regular_file()) files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace berth::test
