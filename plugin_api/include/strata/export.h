// Symbol visibility: everything builds with hidden visibility. STRATA_API marks the classes and
// functions core exports to plugins; STRATA_EXPORT marks a plugin's single entry point.
#pragma once

#define STRATA_API __attribute__((visibility("default")))
#define STRATA_EXPORT __attribute__((visibility("default")))
