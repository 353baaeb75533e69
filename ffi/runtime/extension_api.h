// The table behind jaxll.extension.api() (see jaxll/extension.h).
#pragma once

#include "jaxll/extension.h"

namespace jaxll {

const ExtensionApi* extension_api();

}  // namespace jaxll
