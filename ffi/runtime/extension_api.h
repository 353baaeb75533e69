// The table behind jaxll.extension.api() (jaxll/extension.h), over the workspace registry.
#pragma once

#include "jaxll/extension.h"

namespace jaxll {

const ExtensionApi* extension_api();

}  // namespace jaxll
