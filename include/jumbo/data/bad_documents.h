#pragma once
// What `jumbo data prepare` does with a document it cannot read (data.prepare's
// --bad-documents): stop with the file and line, or skip it and count it. Its own header, so
// the preparation (prepare.h) and its input side (src/data/prepare_input.h) both use it without
// including each other.
namespace jumbo {
enum class BadDocuments { fail, skip };
}  // namespace jumbo
