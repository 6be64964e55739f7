#pragma once
// rlmesh shim: see learner/gloo_shim/README.md. Nothing here is used.
