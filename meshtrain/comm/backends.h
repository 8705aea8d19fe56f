// The built-in backends' registration, kept apart from the registry so that the registry does
// not depend on every backend's header, and the rule by which "auto" picks one of them.
#pragma once

#include <string>

#include "meshtrain/comm/host_layout.h"

namespace meshtrain::comm {

// Registers shm, tcp, hier and auto.
void register_builtin_backends();

// "auto": shm when every rank shares one host, hier when at least two hosts hold several ranks
// each, tcp otherwise.
std::string auto_backend_for(const HostLayout& layout);

}  // namespace meshtrain::comm
