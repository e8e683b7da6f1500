// Shared by the engine's source files. Engine thread only.
#pragma once

namespace arbor::engine {

double engine_now();  // steady clock, seconds

}  // namespace arbor::engine
