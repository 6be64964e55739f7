// A stand-in libnccl for dist/cuda_api_test: every entry dist::OpenNccl
// resolves, none of which does any work. ncclGetVersion answers
// $RLMESH_FAKE_NCCL_VERSION (read at each call, so one test can present
// several versions), NCCL_VERSION_CODE when it is unset; the others fail
// with ncclInvalidUsage.
#include <nccl.h>

#include <cstdlib>

ncclResult_t ncclGetVersion(int* version) {
  const char* v = std::getenv("RLMESH_FAKE_NCCL_VERSION");
  *version = v != nullptr ? std::atoi(v) : NCCL_VERSION_CODE;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId*) { return ncclInvalidUsage; }

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int, ncclUniqueId, int, ncclConfig_t*) {
  *comm = nullptr;
  return ncclInvalidUsage;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t, ncclResult_t*) { return ncclInvalidUsage; }

ncclResult_t ncclCommAbort(ncclComm_t) { return ncclInvalidUsage; }

ncclResult_t ncclBroadcast(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) {
  return ncclInvalidUsage;
}

const char* ncclGetErrorString(ncclResult_t) { return "fake libnccl: no NCCL here"; }

const char* ncclGetLastError(ncclComm_t) { return ""; }
