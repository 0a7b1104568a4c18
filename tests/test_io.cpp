// Token datasets (HDF5) and importers: round trips, validation, every reader error, atomic writes.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "runtime/core/check.h"
#include "runtime/core/fs.h"
#include "runtime/io/importers.h"
#include "runtime/io/token_dataset.h"
#include "tests/expect_error.h"

namespace berth {
namespace {

namespace fs = std::filesystem;

// ---- helpers ------------------------------------------------------------------------------------

// A fresh directory per test under testing::TempDir(), removed afterwards.
class IoTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::path(::testing::TempDir()) /
           fmt::format("berth_io_{}_{}_{}", info->test_suite_name(), info->name(), getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // Names of files in the test directory that look like leftover temporaries.
  std::vector<std::string> temp_leftovers() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir_)) {
      const std::string name = e.path().filename().string();
      if (name.find(".tmp.") != std::string::npos) out.push_back(name);
    }
    return out;
  }

  fs::path dir_;
};

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

using test::expect_error;

TokenDataset small_dataset(int64_t vocab, bool with_mask) {
  TokenDataset ds;
  ds.vocab_size = vocab;
  ds.eot_token = vocab - 1;
  ds.tokenizer = "test-tok";
  ds.tokens = {1, 2, 3, static_cast<uint32_t>(vocab - 1), 4, 5, static_cast<uint32_t>(vocab - 1),
               static_cast<uint32_t>(vocab - 2)};
  ds.doc_offsets = {0, 4, 7, 7, 8};  // includes an empty document
  if (with_mask) ds.loss_mask = {1, 0, 1, 1, 0, 0, 1, 1};
  return ds;
}

void expect_same(const TokenDataset& a, const TokenDataset& b) {
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.doc_offsets, b.doc_offsets);
  EXPECT_EQ(a.loss_mask, b.loss_mask);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.eot_token, b.eot_token);
  EXPECT_EQ(a.tokenizer, b.tokenizer);
}

// Opens an HDF5 file read-write for tests that damage a valid dataset.
struct H5File {
  explicit H5File(const std::string& path) : id(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT)) {
    EXPECT_GE(id, 0) << path;
  }
  ~H5File() {
    if (id >= 0) H5Fclose(id);
  }
  hid_t id;
};

// On-disk element size in bytes of dataset /name.
size_t stored_element_size(const std::string& path, const char* name) {
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  const hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
  const hid_t t = H5Dget_type(d);
  const size_t n = H5Tget_size(t);
  const bool is_unsigned = H5Tget_sign(t) == H5T_SGN_NONE;
  H5Tclose(t);
  H5Dclose(d);
  H5Fclose(f);
  return is_unsigned ? n : 0;
}

void replace_string_attr(hid_t file, const char* name, const std::string& value, bool vlen) {
  if (H5Aexists(file, name) > 0) {
    ASSERT_GE(H5Adelete(file, name), 0);
  }
  const hid_t type = H5Tcopy(H5T_C_S1);
  H5Tset_size(type, vlen ? H5T_VARIABLE : value.size());
  const hid_t space = H5Screate(H5S_SCALAR);
  const hid_t attr = H5Acreate2(file, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
  const char* cstr = value.c_str();
  ASSERT_GE(H5Awrite(attr, type, vlen ? static_cast<const void*>(&cstr) : value.data()), 0);
  H5Aclose(attr);
  H5Sclose(space);
  H5Tclose(type);
}

void replace_int_attr(hid_t file, const char* name, int64_t value) {
  if (H5Aexists(file, name) > 0) {
    ASSERT_GE(H5Adelete(file, name), 0);
  }
  const hid_t space = H5Screate(H5S_SCALAR);
  const hid_t attr = H5Acreate2(file, name, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(H5Awrite(attr, H5T_NATIVE_INT64, &value), 0);
  H5Aclose(attr);
  H5Sclose(space);
}

// llm.c token file bytes: header (magic, version, count), then `tokens` as uint16 LE.
std::string llmc_bytes(int32_t magic, int32_t version, int32_t count,
                       const std::vector<uint16_t>& tokens) {
  std::string b(1024 + 2 * tokens.size(), '\0');
  std::vector<int32_t> header(256, 0);
  header[0] = magic;
  header[1] = version;
  header[2] = count;
  std::memcpy(b.data(), header.data(), 1024);  // test host is little-endian (x86-64, aarch64)
  if (!tokens.empty()) std::memcpy(b.data() + 1024, tokens.data(), 2 * tokens.size());
  return b;
}

// ---- round trips --------------------------------------------------------------------------------

TEST_F(IoTest, RoundTripUint16WithoutMask) {
  const TokenDataset ds = small_dataset(50257, false);
  write_token_dataset(path("a.h5"), ds);
  expect_same(read_token_dataset(path("a.h5")), ds);
  EXPECT_EQ(stored_element_size(path("a.h5"), "tokens"), 2u);
  EXPECT_EQ(stored_element_size(path("a.h5"), "doc_offsets"), 8u);
  EXPECT_TRUE(temp_leftovers().empty());
}

TEST_F(IoTest, RoundTripUint16WithMaskAtVocabBoundary) {
  const TokenDataset ds = small_dataset(65536, true);  // token 65535 still fits uint16
  write_token_dataset(path("a.h5"), ds);
  expect_same(read_token_dataset(path("a.h5")), ds);
  EXPECT_EQ(stored_element_size(path("a.h5"), "tokens"), 2u);
  EXPECT_EQ(stored_element_size(path("a.h5"), "loss_mask"), 1u);
}

TEST_F(IoTest, RoundTripUint32LargeVocab) {
  for (bool mask : {false, true}) {
    TokenDataset ds = small_dataset(70000, mask);
    ds.tokens[0] = 69999;
    ds.tokens[1] = 65536;
    write_token_dataset(path("big.h5"), ds);
    expect_same(read_token_dataset(path("big.h5")), ds);
    EXPECT_EQ(stored_element_size(path("big.h5"), "tokens"), 4u);
  }
}

TEST_F(IoTest, RoundTripEmptyDatasetAndNoEot) {
  TokenDataset ds;
  ds.vocab_size = 10;
  ds.eot_token = -1;
  ds.tokenizer = "";
  ds.doc_offsets = {0};
  write_token_dataset(path("empty.h5"), ds);
  const TokenDataset back = read_token_dataset(path("empty.h5"));
  expect_same(back, ds);
  EXPECT_EQ(back.n_docs(), 0);
}

TEST_F(IoTest, WriteReplacesExistingFile) {
  write_token_dataset(path("a.h5"), small_dataset(300, false));
  const TokenDataset second = small_dataset(50257, true);
  write_token_dataset(path("a.h5"), second);
  expect_same(read_token_dataset(path("a.h5")), second);
  EXPECT_TRUE(temp_leftovers().empty());
}

// ---- validation ---------------------------------------------------------------------------------

TEST(ValidateDataset, AcceptsValid) {
  EXPECT_NO_THROW(validate_dataset(small_dataset(50257, true), "x"));
}

TEST(ValidateDataset, RejectsEachBrokenInvariant) {
  {
    TokenDataset ds = small_dataset(50257, false);
    ds.doc_offsets.back() = 9;  // past the end
    expect_error([&] { validate_dataset(ds, "d.h5"); }, {"'d.h5'", "last doc_offset is 9", "8"});
  }
  {
    TokenDataset ds = small_dataset(50257, false);
    ds.tokens[3] = 70000;
    expect_error([&] { validate_dataset(ds, "d.h5"); },
                 {"'d.h5': token 70000 at index 3 is >= vocab_size 50257"});
  }
  {
    TokenDataset ds = small_dataset(50257, false);
    ds.doc_offsets[0] = 1;
    expect_error([&] { validate_dataset(ds, "d.h5"); }, {"doc_offsets[0] is 1, expected 0"});
  }
  {
    TokenDataset ds = small_dataset(50257, false);
    ds.doc_offsets = {0, 5, 4, 8};
    expect_error([&] { validate_dataset(ds, "d.h5"); }, {"doc_offsets[2] = 4", "non-decreasing"});
    // a negative offset of a signed file type (read with its sign) is shown as negative
    ds.doc_offsets = {0, 5, static_cast<uint64_t>(int64_t{-3}), 8};
    expect_error([&] { validate_dataset(ds, "d.h5"); },
                 {"doc_offsets[2] is -3 (negative); offsets are token positions"});
  }
  {
    TokenDataset ds = small_dataset(50257, false);
    ds.doc_offsets.clear();
    expect_error([&] { validate_dataset(ds, "d.h5"); }, {"doc_offsets is empty"});
  }
  {
    TokenDataset ds = small_dataset(50257, false);
    ds.vocab_size = 0;
    expect_error([&] { validate_dataset(ds, "d.h5"); }, {"vocab_size 0"});
  }
  {
    TokenDataset ds = small_dataset(50257, false);
    ds.eot_token = 50257;
    expect_error([&] { validate_dataset(ds, "d.h5"); }, {"eot_token 50257"});
    ds.eot_token = -2;
    expect_error([&] { validate_dataset(ds, "d.h5"); }, {"eot_token -2"});
  }
  {
    TokenDataset ds = small_dataset(50257, true);
    ds.loss_mask.pop_back();
    expect_error([&] { validate_dataset(ds, "d.h5"); }, {"loss_mask has 7 entries", "8 tokens"});
  }
  {
    TokenDataset ds = small_dataset(50257, true);
    ds.loss_mask[5] = 2;
    expect_error([&] { validate_dataset(ds, "d.h5"); }, {"loss_mask[5] is 2"});
  }
}

TEST_F(IoTest, FailedWriteLeavesNothingBehind) {
  TokenDataset ds = small_dataset(50257, false);
  ds.tokens[2] = 50257;
  expect_error([&] { write_token_dataset(path("bad.h5"), ds); },
               {"token 50257 at index 2 is >= vocab_size 50257"});
  EXPECT_FALSE(fs::exists(path("bad.h5")));
  EXPECT_TRUE(temp_leftovers().empty());

  // A failure inside HDF5 (the directory does not exist) also leaves nothing.
  const std::string missing_dir = path("no/such/dir/x.h5");
  expect_error([&] { write_token_dataset(missing_dir, small_dataset(50257, false)); },
               {"cannot create", "x.h5"});
  EXPECT_FALSE(fs::exists(missing_dir));
  EXPECT_TRUE(temp_leftovers().empty());

  // A failed write over an existing file keeps the old file intact.
  const TokenDataset good = small_dataset(300, true);
  write_token_dataset(path("keep.h5"), good);
  expect_error([&] { write_token_dataset(path("keep.h5"), ds); }, {"is >= vocab_size"});
  expect_same(read_token_dataset(path("keep.h5")), good);
  EXPECT_TRUE(temp_leftovers().empty());
}

// ---- reader errors ------------------------------------------------------------------------------

TEST_F(IoTest, ReadMissingFile) {
  expect_error([&] { read_token_dataset(path("nope.h5")); },
               {"dataset file '" + path("nope.h5") + "' does not exist", "berth data import"});
}

TEST_F(IoTest, ReadNotHdf5) {
  write_bytes(path("junk.h5"), std::string(4096, 'x') + "not an hdf5 file");
  expect_error([&] { read_token_dataset(path("junk.h5")); },
               {path("junk.h5") + "' is not a readable HDF5 file (corrupt or truncated?)"});
  write_bytes(path("tiny.h5"), "");
  expect_error([&] { read_token_dataset(path("tiny.h5")); }, {"is not a readable HDF5 file"});
}

TEST_F(IoTest, ReadTruncatedHdf5) {
  TokenDataset ds = small_dataset(50257, true);
  ds.tokens.assign(100000, 7);  // big enough that half the file cuts through the data
  ds.loss_mask.assign(100000, 1);
  ds.doc_offsets = {0, 50000, 100000};
  write_token_dataset(path("t.h5"), ds);
  const std::string full = read_bytes(path("t.h5"));
  ASSERT_GT(full.size(), 200000u);
  write_bytes(path("t.h5"), full.substr(0, full.size() / 2));
  expect_error([&] { read_token_dataset(path("t.h5")); },
               {path("t.h5") + "' is not a readable HDF5 file (corrupt or truncated?)"});
}

TEST_F(IoTest, ReadMissingDocOffsets) {
  write_token_dataset(path("a.h5"), small_dataset(50257, false));
  {
    H5File f(path("a.h5"));
    ASSERT_GE(H5Ldelete(f.id, "doc_offsets", H5P_DEFAULT), 0);
  }
  expect_error([&] { read_token_dataset(path("a.h5")); },
               {path("a.h5") +
                "' has no /doc_offsets dataset: not a berth token dataset; import it with `berth "
                "data import`"});
}

TEST_F(IoTest, ReadWrongOrMissingFormat) {
  write_token_dataset(path("a.h5"), small_dataset(50257, false));
  {
    H5File f(path("a.h5"));
    replace_string_attr(f.id, "format", "berth-checkpoint", true);
  }
  expect_error([&] { read_token_dataset(path("a.h5")); },
               {"has format 'berth-checkpoint', expected 'berth-tokens'"});
  {
    H5File f(path("a.h5"));
    ASSERT_GE(H5Adelete(f.id, "format"), 0);
  }
  expect_error([&] { read_token_dataset(path("a.h5")); },
               {"has no 'format' attribute", "berth data import"});
  {
    H5File f(path("a.h5"));
    ASSERT_GE(H5Adelete(f.id, "vocab_size"), 0);
    replace_string_attr(f.id, "format", "berth-tokens", true);
  }
  expect_error([&] { read_token_dataset(path("a.h5")); }, {"has no 'vocab_size' attribute"});
}

TEST_F(IoTest, ReadFixedLengthFormatStringIsAccepted) {
  const TokenDataset ds = small_dataset(50257, false);
  write_token_dataset(path("a.h5"), ds);
  {
    H5File f(path("a.h5"));
    replace_string_attr(f.id, "format", "berth-tokens", false);
    replace_string_attr(f.id, "tokenizer", "test-tok", false);
  }
  expect_same(read_token_dataset(path("a.h5")), ds);
}

TEST_F(IoTest, ReadNewerFormatVersion) {
  write_token_dataset(path("a.h5"), small_dataset(50257, false));
  {
    H5File f(path("a.h5"));
    replace_int_attr(f.id, "format_version", 2);
  }
  expect_error([&] { read_token_dataset(path("a.h5")); },
               {"format_version 2, this build reads 1", "upgrade berth"});
}

TEST_F(IoTest, ReadWrongTokenDtype) {
  write_token_dataset(path("a.h5"), small_dataset(50257, false));
  {
    H5File f(path("a.h5"));
    ASSERT_GE(H5Ldelete(f.id, "tokens", H5P_DEFAULT), 0);
    const hsize_t dims[1] = {8};
    const std::vector<float> vals(8, 1.0f);
    const hid_t space = H5Screate_simple(1, dims, nullptr);
    const hid_t d = H5Dcreate2(f.id, "tokens", H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT,
                               H5P_DEFAULT);
    ASSERT_GE(H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, vals.data()), 0);
    H5Dclose(d);
    H5Sclose(space);
  }
  expect_error([&] { read_token_dataset(path("a.h5")); },
               {"/tokens has element type float32, expected uint16 or uint32"});
}

TEST_F(IoTest, ReadIntegerTypeWithPaddingBitsIsRefused) {
  // A 4-byte token type whose header says 16 bits from bit 8 are the number (one damaged byte,
  // or an odd writer): HDF5 would convert every token to another value without a word.
  write_token_dataset(path("a.h5"), small_dataset(50257, false));
  {
    H5File f(path("a.h5"));
    ASSERT_GE(H5Ldelete(f.id, "tokens", H5P_DEFAULT), 0);
    const hsize_t dims[1] = {8};
    const std::vector<uint32_t> vals(8, 1);
    const hid_t type = H5Tcopy(H5T_STD_U32LE);
    ASSERT_GE(H5Tset_precision(type, 16), 0);
    ASSERT_GE(H5Tset_offset(type, 8), 0);
    const hid_t space = H5Screate_simple(1, dims, nullptr);
    const hid_t d = H5Dcreate2(f.id, "tokens", type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    ASSERT_GE(H5Dwrite(d, H5T_NATIVE_UINT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, vals.data()), 0);
    H5Dclose(d);
    H5Sclose(space);
    H5Tclose(type);
  }
  expect_error([&] { read_token_dataset(path("a.h5")); },
               {"/tokens is a 4-byte integer whose header says only 16 of its bits, from bit 8",
                "a damaged type header"});
}

TEST_F(IoTest, ReadHeaderDeclaringMoreTokensThanStoredIsRefusedBeforeAllocating) {
  // 2^40 tokens declared, none written: reading would allocate 4 TiB for values not in the file.
  write_token_dataset(path("a.h5"), small_dataset(50257, false));
  {
    H5File f(path("a.h5"));
    ASSERT_GE(H5Ldelete(f.id, "tokens", H5P_DEFAULT), 0);
    const hsize_t dims[1] = {hsize_t(1) << 40};
    const hid_t space = H5Screate_simple(1, dims, nullptr);
    const hid_t d =
        H5Dcreate2(f.id, "tokens", H5T_STD_U32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    ASSERT_GE(d, 0);
    H5Dclose(d);
    H5Sclose(space);
  }
  for (const bool data : {true, false}) {
    expect_error(
        [&] {
          if (data) {
            read_token_dataset(path("a.h5"));
          } else {
            read_token_dataset_shape(path("a.h5"));
          }
        },
        {"/tokens declares 1099511627776 values (4398046511104 bytes) but the file stores 0 "
         "bytes of it: truncated or corrupt"});
  }
}

TEST_F(IoTest, ReadCompressedTokensWithUnwrittenChunksIsRefused) {
  // Compressed, the stored size cannot be compared with the declared one; a chunk never written
  // read back as zeros (a 10 KB file trained on 3 M zero tokens).
  write_token_dataset(path("gz.h5"), small_dataset(257, false));
  constexpr hsize_t kChunk = 1024, kN = 4 * kChunk;
  {
    H5File f(path("gz.h5"));
    ASSERT_GE(H5Ldelete(f.id, "tokens", H5P_DEFAULT), 0);
    ASSERT_GE(H5Ldelete(f.id, "doc_offsets", H5P_DEFAULT), 0);
    const hsize_t dims[1] = {kN}, chunk[1] = {kChunk};
    const hid_t space = H5Screate_simple(1, dims, nullptr);
    const hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    ASSERT_GE(H5Pset_chunk(dcpl, 1, chunk), 0);
    ASSERT_GE(H5Pset_deflate(dcpl, 6), 0);
    const hid_t d =
        H5Dcreate2(f.id, "tokens", H5T_STD_U16LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    ASSERT_GE(d, 0);
    const std::vector<uint16_t> first(kChunk, 1);  // the first chunk only
    const hsize_t start[1] = {0};
    const hid_t mem = H5Screate_simple(1, chunk, nullptr);
    ASSERT_GE(H5Sselect_hyperslab(space, H5S_SELECT_SET, start, nullptr, chunk, nullptr), 0);
    ASSERT_GE(H5Dwrite(d, H5T_NATIVE_UINT16, mem, space, H5P_DEFAULT, first.data()), 0);
    H5Sclose(mem);
    H5Dclose(d);
    H5Pclose(dcpl);
    H5Sclose(space);
    const hsize_t two[1] = {2};
    const uint64_t offsets[2] = {0, kN};
    const hid_t os = H5Screate_simple(1, two, nullptr);
    const hid_t od =
        H5Dcreate2(f.id, "doc_offsets", H5T_STD_U64LE, os, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    ASSERT_GE(H5Dwrite(od, H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, offsets), 0);
    H5Dclose(od);
    H5Sclose(os);
  }
  expect_error([&] { read_token_dataset(path("gz.h5")); },
               {"/tokens declares 4096 values in 4 chunks but the file holds 1 of them",
                "truncated or corrupt"});
}

// Chunked and compressed datasets as h5py writes them (compression="gzip", chunks=True,
// maxshape), their last chunk partial, are read: H5Dget_space_status (HDF5 < 1.10.9) called
// them partly written.
TEST_F(IoTest, ReadChunkedAndCompressedTokensWithAPartialLastChunk) {
  const TokenDataset ds = small_dataset(257, true);
  ASSERT_NE(ds.tokens.size() % 3, 0u) << "the last chunk must be partial";
  for (const bool deflate : {false, true}) {
    SCOPED_TRACE(deflate ? "gzip" : "chunked");
    write_token_dataset(path("c.h5"), ds);
    {
      H5File f(path("c.h5"));
      for (const char* name : {"tokens", "loss_mask"}) {
        const hid_t old = H5Dopen2(f.id, name, H5P_DEFAULT);
        const hid_t type = H5Dget_type(old);
        std::vector<char> bytes(ds.tokens.size() * H5Tget_size(type));
        ASSERT_GE(H5Dread(old, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, bytes.data()), 0);
        H5Dclose(old);
        ASSERT_GE(H5Ldelete(f.id, name, H5P_DEFAULT), 0);
        const hsize_t dims[1] = {ds.tokens.size()}, chunk[1] = {3}, most[1] = {H5S_UNLIMITED};
        const hid_t space = H5Screate_simple(1, dims, most);
        const hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
        ASSERT_GE(H5Pset_chunk(dcpl, 1, chunk), 0);
        if (deflate) {
          ASSERT_GE(H5Pset_deflate(dcpl, 4), 0);
        }
        const hid_t d = H5Dcreate2(f.id, name, type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
        ASSERT_GE(H5Dwrite(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, bytes.data()), 0);
        H5Dclose(d);
        H5Pclose(dcpl);
        H5Sclose(space);
        H5Tclose(type);
      }
    }
    const TokenDataset back = read_token_dataset(path("c.h5"));
    EXPECT_EQ(back.tokens, ds.tokens);
    EXPECT_EQ(back.loss_mask, ds.loss_mask);
  }
}

// A dataset whose stored size matches a header larger than the memory the process may use (space
// allocated, never written: a sparse file) is refused before the allocation fails, when its values
// are to be read; its shape alone (berth plan, which reads headers) still reads.
TEST_F(IoTest, ReadTokensLargerThanMemoryIsRefusedButItsShapeReads) {
  write_token_dataset(path("big.h5"), small_dataset(257, false));
  const double memory = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGESIZE));
  const hsize_t n = hsize_t(memory / 4) + (hsize_t(1) << 30);  // uint32: more bytes than memory
  {
    H5File f(path("big.h5"));
    ASSERT_GE(H5Ldelete(f.id, "tokens", H5P_DEFAULT), 0);
    const hsize_t dims[1] = {n};
    const hid_t space = H5Screate_simple(1, dims, nullptr);
    const hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    ASSERT_GE(H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY), 0);
    ASSERT_GE(H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER), 0);
    const hid_t d =
        H5Dcreate2(f.id, "tokens", H5T_STD_U32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    ASSERT_GE(d, 0);
    H5Dclose(d);
    H5Pclose(dcpl);
    H5Sclose(space);
  }
  expect_error([&] { read_token_dataset(path("big.h5")); },
               {"/tokens declares " + std::to_string(n) + " values",
                "more than this process may use", "cgroup's limit"});
  EXPECT_EQ(read_token_dataset_shape(path("big.h5")).n_tokens, int64_t(n));
  std::filesystem::remove(path("big.h5"));
}

TEST_F(IoTest, ReadValidatesContents) {
  write_token_dataset(path("a.h5"), small_dataset(50257, false));
  {
    H5File f(path("a.h5"));
    replace_int_attr(f.id, "vocab_size", 100);  // tokens[0..] are up to 50256
    replace_int_attr(f.id, "eot_token", 5);
  }
  expect_error([&] { read_token_dataset(path("a.h5")); },
               {path("a.h5") + "': token 50256 at index 3 is >= vocab_size 100"});
}

// ---- statistics ---------------------------------------------------------------------------------

TEST(DatasetInfo, Statistics) {
  TokenDataset ds;
  ds.vocab_size = 1000;
  ds.eot_token = 999;
  ds.tokenizer = "t";
  // 10 documents of lengths 1..10 (55 tokens); tokens are t % 20 -> 20 distinct values.
  ds.doc_offsets = {0};
  for (int len = 1; len <= 10; ++len) {
    for (int i = 0; i < len; ++i) ds.tokens.push_back(static_cast<uint32_t>(ds.tokens.size() % 20));
    ds.doc_offsets.push_back(ds.tokens.size());
  }
  ds.loss_mask.assign(ds.tokens.size(), 1);
  const DatasetInfo info = dataset_info(ds);
  EXPECT_EQ(info.n_docs, 10);
  EXPECT_EQ(info.n_tokens, 55);
  EXPECT_EQ(info.min_len, 1);
  EXPECT_EQ(info.max_len, 10);
  EXPECT_DOUBLE_EQ(info.mean_len, 5.5);
  EXPECT_EQ(info.p50_len, 5);
  EXPECT_EQ(info.p90_len, 9);
  EXPECT_EQ(info.p99_len, 10);
  EXPECT_EQ(info.distinct_tokens, 20);
  EXPECT_TRUE(info.has_loss_mask);
  EXPECT_EQ(info.vocab_size, 1000);
  EXPECT_EQ(info.eot_token, 999);

  const std::string text = format_dataset_info("d.h5", info);
  for (const char* part : {"d.h5", "documents    10", "tokens       55", "min 1", "mean 5.5",
                           "p50 5", "p90 9", "p99 10", "max 10", "1000", "eot 999", "'t'",
                           "20 tokens used", "loss mask    yes"}) {
    EXPECT_NE(text.find(part), std::string::npos) << part << " missing in:\n" << text;
  }

  TokenDataset empty;
  empty.vocab_size = 5;
  empty.doc_offsets = {0};
  const DatasetInfo e = dataset_info(empty);
  EXPECT_EQ(e.n_docs, 0);
  EXPECT_EQ(e.distinct_tokens, 0);
  EXPECT_FALSE(e.has_loss_mask);
  EXPECT_NE(format_dataset_info("e.h5", e).find("loss mask    no"), std::string::npos);
}

// ---- text import --------------------------------------------------------------------------------

TEST_F(IoTest, ImportTextFiles) {
  write_bytes(path("a.txt"), "hi\n");
  write_bytes(path("empty.txt"), "");
  write_bytes(path("b.txt"), std::string("\xff\x00z", 3));
  const TokenDataset ds = import_text_files({path("a.txt"), path("empty.txt"), path("b.txt")});
  EXPECT_EQ(ds.n_docs(), 2);
  EXPECT_EQ(ds.vocab_size, 257);
  EXPECT_EQ(ds.eot_token, 256);
  EXPECT_EQ(ds.tokenizer, "bytes");
  EXPECT_EQ(ds.tokens, (std::vector<uint32_t>{'h', 'i', '\n', 256, 255, 0, 'z', 256}));
  EXPECT_EQ(ds.doc_offsets, (std::vector<uint64_t>{0, 4, 8}));
  EXPECT_TRUE(ds.loss_mask.empty());

  // Through the HDF5 file and back.
  write_token_dataset(path("text.h5"), ds);
  expect_same(read_token_dataset(path("text.h5")), ds);

  expect_error([&] { import_text_files({path("a.txt"), path("missing.txt")}); },
               {"text file '" + path("missing.txt") + "' does not exist"});
}

TEST(SplitValidation, KeepsDocumentBoundaries) {
  TokenDataset all;
  all.vocab_size = 100;
  all.eot_token = 99;
  all.tokenizer = "t";
  all.doc_offsets = {0};
  for (int d = 0; d < 10; ++d) {
    for (int i = 0; i <= d; ++i) all.tokens.push_back(static_cast<uint32_t>(d));
    all.doc_offsets.push_back(all.tokens.size());
  }
  all.loss_mask.assign(all.tokens.size(), 0);
  for (size_t i = 0; i < all.loss_mask.size(); i += 2) all.loss_mask[i] = 1;

  TokenDataset train, val;
  split_validation(all, 0.2, &train, &val);
  EXPECT_EQ(train.n_docs(), 8);
  EXPECT_EQ(val.n_docs(), 2);
  EXPECT_EQ(train.n_tokens() + val.n_tokens(), all.n_tokens());
  EXPECT_EQ(val.doc_offsets, (std::vector<uint64_t>{0, 9, 19}));  // docs 8 and 9, re-based
  EXPECT_EQ(val.tokens, (std::vector<uint32_t>(all.tokens.end() - 19, all.tokens.end())));
  EXPECT_EQ(val.loss_mask,
            (std::vector<uint8_t>(all.loss_mask.end() - 19, all.loss_mask.end())));
  EXPECT_EQ(train.doc_offsets,
            (std::vector<uint64_t>(all.doc_offsets.begin(), all.doc_offsets.end() - 2)));
  EXPECT_EQ(train.tokens, (std::vector<uint32_t>(all.tokens.begin(), all.tokens.end() - 19)));
  EXPECT_EQ(val.vocab_size, 100);
  EXPECT_EQ(val.eot_token, 99);
  EXPECT_EQ(val.tokenizer, "t");
  EXPECT_NO_THROW(validate_dataset(train, "train"));
  EXPECT_NO_THROW(validate_dataset(val, "val"));

  // At least one validation document when there are >= 2, never all of them.
  split_validation(all, 0.001, &train, &val);
  EXPECT_EQ(val.n_docs(), 1);
  split_validation(all, 0.99, &train, &val);
  EXPECT_EQ(train.n_docs(), 1);
  EXPECT_EQ(val.n_docs(), 9);

  // Fraction 0: everything is training data, validation is empty but valid.
  split_validation(all, 0.0, &train, &val);
  expect_same(train, all);
  EXPECT_EQ(val.n_docs(), 0);
  EXPECT_NO_THROW(validate_dataset(val, "val"));

  // Output may alias the input.
  TokenDataset alias = all;
  split_validation(alias, 0.2, &alias, &val);
  EXPECT_EQ(alias.n_docs(), 8);
  EXPECT_EQ(val.n_docs(), 2);

  expect_error([&] { split_validation(all, 1.0, &train, &val); }, {"validation fraction 1"});
  expect_error([&] { split_validation(all, -0.1, &train, &val); }, {"validation fraction -0.1"});
}

// ---- llm.c token files --------------------------------------------------------------------------

TEST_F(IoTest, LlmcRoundTrip) {
  const std::vector<uint32_t> tokens = {50256, 10, 20, 30, 50256, 40, 50256, 50256, 7};
  write_llmc_tokens(path("t.bin"), tokens);
  EXPECT_TRUE(temp_leftovers().empty());
  EXPECT_EQ(fs::file_size(path("t.bin")), 1024u + 2 * tokens.size());
  const TokenDataset ds = import_llmc_tokens(path("t.bin"));
  EXPECT_EQ(ds.tokens, tokens);
  EXPECT_EQ(ds.doc_offsets, (std::vector<uint64_t>{0, 4, 6, 7, 9}));
  EXPECT_EQ(ds.vocab_size, 50257);
  EXPECT_EQ(ds.eot_token, 50256);
  EXPECT_EQ(ds.tokenizer, "gpt2");
  EXPECT_NO_THROW(validate_dataset(ds, "t.bin"));

  // Export -> import is the identity on the token stream.
  write_llmc_tokens(path("t2.bin"), ds.tokens);
  EXPECT_EQ(read_bytes(path("t2.bin")), read_bytes(path("t.bin")));

  // Tokens before the first EOT form document 0; an empty file has no documents.
  write_llmc_tokens(path("lead.bin"), {1, 2, 50256, 3});
  EXPECT_EQ(import_llmc_tokens(path("lead.bin")).doc_offsets, (std::vector<uint64_t>{0, 2, 4}));
  write_llmc_tokens(path("none.bin"), {});
  const TokenDataset none = import_llmc_tokens(path("none.bin"));
  EXPECT_EQ(none.n_docs(), 0);
  EXPECT_NO_THROW(validate_dataset(none, "none.bin"));

  // The byte layout matches llm.c: int32 header, uint16 little-endian tokens.
  write_bytes(path("raw.bin"), llmc_bytes(20240520, 1, 3, {5, 50256, 6}));
  EXPECT_EQ(import_llmc_tokens(path("raw.bin")).tokens, (std::vector<uint32_t>{5, 50256, 6}));
}

TEST_F(IoTest, LlmcMalformed) {
  write_bytes(path("magic.bin"), llmc_bytes(1234, 1, 2, {1, 2}));
  expect_error([&] { import_llmc_tokens(path("magic.bin")); },
               {path("magic.bin") + "'",
                "magic 1234, expected 20240520 (an llm.c token .bin file); is this a model file?"});

  write_bytes(path("model.bin"), llmc_bytes(20240326, 3, 2, {1, 2}));
  expect_error([&] { import_llmc_tokens(path("model.bin")); }, {"llm.c model file"});

  write_bytes(path("short.bin"), std::string(100, '\0'));
  expect_error([&] { import_llmc_tokens(path("short.bin")); }, {"truncated header", "100 bytes"});

  write_bytes(path("version.bin"), llmc_bytes(20240520, 2, 2, {1, 2}));
  expect_error([&] { import_llmc_tokens(path("version.bin")); }, {"version 2"});

  write_bytes(path("count.bin"), llmc_bytes(20240520, 1, 5, {1, 2, 3}));
  expect_error([&] { import_llmc_tokens(path("count.bin")); },
               {"header says 5 tokens", "1030 bytes", "1034", "truncated"});
  // Longer than the header says: not "truncated".
  write_bytes(path("long.bin"), llmc_bytes(20240520, 1, 2, {1, 2, 3}));
  expect_error([&] { import_llmc_tokens(path("long.bin")); },
               {"header says 2 tokens", "data past the last token"});

  write_bytes(path("big.bin"), llmc_bytes(20240520, 1, 3, {1, 50300, 2}));
  expect_error([&] { import_llmc_tokens(path("big.bin")); },
               {"token 50300 at index 1 is >= the GPT-2 vocab size 50257"});

  expect_error([&] { import_llmc_tokens(path("missing.bin")); }, {"does not exist"});
  // Given where a token dataset goes (data info, data.train): the command that converts it.
  expect_error(
      [&] { read_token_dataset_shape(path("count.bin")); },
      {"is an llm.c token file, not a berth token dataset", "berth data import --format llmc"});
}

TEST_F(IoTest, LlmcWriteRejectsWideTokens) {
  expect_error([&] { write_llmc_tokens(path("w.bin"), {1, 65536}); },
               {"token 65536 at index 1 does not fit uint16"});
  EXPECT_FALSE(fs::exists(path("w.bin")));
  EXPECT_TRUE(temp_leftovers().empty());
}

// A stop's amend of the last line of an append-only file cuts it at the line's start and writes the
// line again; where the path names another file now (a launch that took the run directory over
// replaced it), that file is left alone.
TEST_F(IoTest, RewriteFromAmendsTheLastLineOfItsOwnFileOnly) {
  const std::string p = path("log.jsonl");
  std::ofstream out(p, std::ios::trunc);
  out << "one\n";
  const std::streamoff at = out.tellp();
  out << "two\n";
  out.flush();
  const FileId mine = file_id(p);
  ASSERT_TRUE(rewrite_from(out, p, mine, at, "TWO\n"));
  EXPECT_EQ(read_text_file(p), "one\nTWO\n");
  fs::remove(p);
  std::ofstream(p) << "the other launch's line\n";
  EXPECT_FALSE(rewrite_from(out, p, mine, at, "2\n"));
  EXPECT_EQ(read_text_file(p), "the other launch's line\n");
}

// Ctrl-C or a job's time limit (SIGINT, SIGTERM) during a write left the temporary behind for
// good: `data import` of a corpus, gigabytes. remove_temporaries_on_signals removes what is being
// written, a temporary directory with its registered file inside too, keeps what was committed,
// and the process still dies of the signal.
TEST_F(IoTest, ASignalRemovesTheTemporariesBeingWrittenAndStillEndsTheProcess) {
  for (const int sig : {SIGTERM, SIGINT}) {
    const std::string ready = path("ready"), kept = path("kept.txt"), lost = path("lost.h5");
    fs::remove(ready);
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      remove_temporaries_on_signals();
      write_file_atomic(kept, "committed\n");
      write_via_temp(lost, [&](const std::string& tmp) {
        std::ofstream(tmp) << "half";
        const std::string dir = temp_path_for(path("export"));
        fs::create_directory(dir);
        const ScopedTemp dir_removed(dir);
        const std::string inner = dir + "/model.safetensors.tmp.1.0";
        std::ofstream(inner) << "half";
        const ScopedTemp inner_removed(inner);
        std::ofstream(ready) << "1";
        for (;;) pause();
      });
      _exit(0);
    }
    for (int i = 0; i < 2000 && !fs::exists(ready); ++i) usleep(5000);
    ASSERT_TRUE(fs::exists(ready)) << "the child never got to its write";
    kill(child, sig);
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == sig) << "status " << status;
    EXPECT_TRUE(temp_leftovers().empty()) << "left: " << temp_leftovers().front();
    EXPECT_FALSE(fs::exists(lost));
    EXPECT_EQ(read_text_file(kept), "committed\n");
  }
}

}  // namespace
}  // namespace berth
