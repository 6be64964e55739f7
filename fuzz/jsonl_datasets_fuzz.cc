// JSONL datasets (task prompts with answers, chat records, pretraining
// text): the first byte picks the reader, the rest is the file. Any bytes
// give records or an error naming the line, never a crash or a hang.
#include <cstdint>

#include "fuzz/input_file.h"
#include "tasks/chat_data.h"
#include "tasks/task.h"
#include "tasks/text_corpus.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t which = data[0] % 3;
  const std::string path = rlmesh::fuzz::WriteInputFile(data + 1, size - 1, ".jsonl");
  switch (which) {
    case 0:
      (void)rlmesh::ReadJsonlExamples(path, "prompt", "answer", "train");
      break;
    case 1:
      (void)rlmesh::ReadChatJsonl(path, "messages");
      break;
    default:
      (void)rlmesh::ReadTextCorpus(path, "text");
      break;
  }
  return 0;
}
