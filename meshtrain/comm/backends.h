// The built-in backends' registration, kept apart from the registry so that the registry does
// not depend on every backend's header.
#pragma once

namespace meshtrain::comm {

// Registers shm, tcp, hier and auto.
void register_builtin_backends();

}  // namespace meshtrain::comm
