#pragma once

// RLMESH_ASAN is 1 in AddressSanitizer builds, under gcc (which defines
// __SANITIZE_ADDRESS__; gcc 12 has no __has_feature) and clang alike, else 0.

#if defined(__SANITIZE_ADDRESS__)
#define RLMESH_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RLMESH_ASAN 1
#endif
#endif
#ifndef RLMESH_ASAN
#define RLMESH_ASAN 0
#endif
