// Anchor translation unit that builds the libtorch precompiled header.
