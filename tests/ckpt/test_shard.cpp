// Shard geometry and HDF5 images: pieces cut by tensor parallelism (rectangles) and by the
// distributed optimizer (element ranges) reassemble into any other cut.
#include <gtest/gtest.h>

#include <numeric>

#include "jumbo/ckpt/manifest.h"
#include "jumbo/ckpt/shard.h"
#include "jumbo/config/config.h"

namespace jumbo {
namespace {

TensorPiece piece(std::vector<int64_t> global, std::vector<int64_t> offset,
                  std::vector<int64_t> shape, int64_t begin = 0, int64_t end = -1) {
  TensorPiece p{"w", global, offset, shape};
  p.flat_begin = begin;
  p.flat_end = end < 0 ? p.rect_numel() : end;
  return p;
}

// The value of global element (r, c): distinct everywhere.
float value_at(int64_t r, int64_t c) { return static_cast<float>(r * 1000 + c) + 0.5f; }

std::vector<float> fill(const TensorPiece& p) {
  std::vector<float> out;
  const int64_t cols = p.shape.size() == 2 ? p.shape[1] : p.shape[0];
  for (int64_t e = p.flat_begin; e < p.flat_end; ++e) {
    if (p.shape.size() == 2) {
      out.push_back(value_at(p.offset[0] + e / cols, p.offset[1] + e % cols));
    } else {
      out.push_back(value_at(0, p.offset[0] + e));
    }
  }
  return out;
}

TEST(PieceOverlap, ColumnSplitAgainstRowRangeOfAnotherSplit) {
  // tp 2 column halves of a 4 x 6 tensor vs. tp 3 column thirds cut by an element range.
  const TensorPiece a = piece({4, 6}, {0, 3}, {4, 3});
  const TensorPiece b = piece({4, 6}, {0, 2}, {4, 2}, 3, 7);  // rows 1..3 partly
  const auto runs = piece_overlap(a, b);
  // b holds (1,3) (2,2) (2,3) (3,2); a holds columns 3..5: (1,3) and (2,3).
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_EQ(runs[0].a, 3 * 1 + 0);
  EXPECT_EQ(runs[0].b, 0);
  EXPECT_EQ(runs[0].length, 1);
  EXPECT_EQ(runs[1].a, 3 * 2 + 0);
  EXPECT_EQ(runs[1].b, 2);
}

TEST(PieceOverlap, EqualRectanglesMergeIntoOneRun) {
  const TensorPiece a = piece({8, 4}, {2, 0}, {4, 4});
  const auto runs = piece_overlap(a, a);
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].length, 16);
}

TEST(ShardImage, RoundTripAcrossCuts) {
  // Saved: a 6 x 5 tensor in three pieces: rows 0-2 whole, rows 3-5 cut at element 7.
  std::vector<TensorPiece> saved = {piece({6, 5}, {0, 0}, {3, 5}),
                                    piece({6, 5}, {3, 0}, {3, 5}, 0, 7),
                                    piece({6, 5}, {3, 0}, {3, 5}, 7, 15)};
  std::vector<std::vector<float>> data;
  std::vector<PieceData> pd;
  for (const TensorPiece& p : saved) data.push_back(fill(p));
  for (size_t i = 0; i < saved.size(); ++i) {
    PieceData d;
    d.piece = saved[i];
    d.state = {data[i].data(), data[i].data(), data[i].data()};
    pd.push_back(d);
  }
  const std::vector<char> image = build_shard_image(pd, {{"step", 7}});
  ShardReader reader(image, "test.h5");
  EXPECT_EQ(reader.pieces().size(), 3u);
  // Loaded: the right 2 columns (tp-style), elements 1..9 of that rectangle (ZeRO-style).
  const TensorPiece target = piece({6, 5}, {0, 3}, {6, 2}, 1, 10);
  std::vector<float> got(static_cast<size_t>(target.count()), -1.f);
  int64_t copied = 0;
  for (const TensorPiece& p : saved) copied += reader.copy_overlap(p, 1, target, got.data());
  EXPECT_EQ(copied, target.count());
  EXPECT_EQ(got, fill(target));
}

TEST(ShardImage, OneDimensionalPieces) {
  const TensorPiece whole = piece({10}, {0}, {10});
  std::vector<float> data = fill(whole);
  PieceData d{whole, {data.data(), data.data(), data.data()}};
  const std::vector<char> image = build_shard_image({d}, {});
  ShardReader reader(image, "bias.h5");
  const TensorPiece target = piece({10}, {5}, {5}, 1, 4);
  std::vector<float> got(3);
  EXPECT_EQ(reader.copy_overlap(whole, 2, target, got.data()), 3);
  EXPECT_EQ(got, fill(target));
}

TEST(ShardImage, GarbageIsAClearError) {
  const std::vector<char> junk(4096, 'x');
  try {
    ShardReader reader(junk, "junk.h5");
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("junk.h5: not a readable HDF5 file"), std::string::npos);
  }
}

Manifest sample_manifest() {
  Manifest m;
  m.progress.step = 12;
  m.progress.consumed_samples = 288;
  m.model.name = "tiny";
  m.model.layers = 2;
  m.model.d_model = 8;
  m.model.heads = 2;
  m.model.vocab = 100;
  m.model.context = 4;
  add_shard_record(m, shard_record_to_json({"tp0-pp0-dp0.h5", 100, 0xdeadbeef},
                                           {piece({6, 5}, {0, 0}, {3, 5})}));
  return m;
}

TEST(Manifest, RoundTrip) {
  const Manifest m = sample_manifest();
  const Manifest back = parse_manifest(manifest_to_json(m), "m.json");
  EXPECT_EQ(back.progress.step, 12);
  EXPECT_EQ(back.progress.consumed_samples, 288);
  ASSERT_EQ(back.files.size(), 1u);
  EXPECT_EQ(back.files[0].crc32, 0xdeadbeefu);
  ASSERT_EQ(back.tensors.at("w").size(), 1u);
  EXPECT_EQ(back.tensors.at("w")[0].piece.shape, (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(back.model.ffn, 32);
}

TEST(Manifest, MismatchAndGarbageAreOneLineErrors) {
  const Manifest m = sample_manifest();
  ModelConfig run = m.model;
  run.d_model = 16;
  try {
    check_manifest_model(m, run, "ck/step_00000012/manifest.json", "run.toml");
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_STREQ(e.what(),
                 "ck/step_00000012/manifest.json: model.d_model = 8 in the checkpoint, but "
                 "run.toml says 16: a checkpoint loads only into the model it was saved from");
  }
  EXPECT_THROW(parse_manifest("{\"format\": \"jumbo-checkpoint\"", "m.json"), UserError);
  EXPECT_THROW(parse_manifest("{}", "m.json"), UserError);
  EXPECT_EQ(checkpoint_step_of("step_00000012"), 12);
  EXPECT_EQ(checkpoint_step_of("step_x"), -1);
  EXPECT_EQ(checkpoint_dir_name(5), "step_00000005");
}

}  // namespace
}  // namespace jumbo
