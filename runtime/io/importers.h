// Importers from other formats into berth token datasets (token_dataset.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/io/token_dataset.h"

namespace berth {

// Byte-level text: every file is one document, its bytes are tokens 0..255, followed by the EOT
// token 256; vocab_size 257, tokenizer "bytes". Empty files are skipped with no document; a
// missing/unreadable file is an Error naming it. When val_fraction > 0, the last
// round(val_fraction * n_docs) documents (at least 1 when there are >= 2 documents, at most
// n_docs - 1 so `train` is never empty) go to `val`; val_fraction must be in [0, 1).
constexpr int64_t kByteEot = 256;
constexpr int64_t kByteVocab = 257;
TokenDataset import_text_files(const std::vector<std::string>& files);
void split_validation(const TokenDataset& all, double val_fraction, TokenDataset* train,
                      TokenDataset* val);

// llm.c token file: 256 x int32 header (magic 20240520, version 1, token count), then uint16
// tokens. Tokens are kept verbatim (so export -> import round-trips). llm.c writes each document
// as [EOT, tokens...] with the GPT-2 EOT 50256, so a document starts at every EOT and runs to the
// next one; tokens before the first EOT (if any) form document 0.
// vocab_size 50257, tokenizer "gpt2". Bad magic/version, a count that disagrees with the file
// size, or tokens >= 50257 are Errors naming the file.
constexpr int32_t kLlmcTokenMagic = 20240520;
constexpr int32_t kLlmcTokenVersion = 1;
TokenDataset import_llmc_tokens(const std::string& path);

// Writes an llm.c token file (for round-trip tests and interop); tokens must fit uint16.
void write_llmc_tokens(const std::string& path, const std::vector<uint32_t>& tokens);

}  // namespace berth
