// fsdpx/export.h: visibility of libfsdpx's public symbols. Everything in fsdpx is compiled with
// hidden visibility; FSDPX_API marks what libfsdpx exports to hosts and plugins.
#pragma once

#define FSDPX_API __attribute__((visibility("default")))
