// Carrier of the shared precompiled header (see CMakeLists.txt).
