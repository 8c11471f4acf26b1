// The values of a host's own numeric options (fsdpx-train's --steps, --rank, --rendezvous-timeout),
// checked as a component's options are: parsed by the same rules, refused outside their declared
// range, and refused with the expected type and range in the message ("--steps expects an integer
// of at least 1, got 'abc'"), on the command line and in an INI file alike.
#pragma once

#include <cstdint>

#include <boost/program_options/value_semantic.hpp>

#include "fsdpx/export.h"
#include "fsdpx/options.h"

namespace fsdpx {

// A value semantic for po::options_description::add_options(): an integer (stored as T: int or
// int64_t) in `range`, or a finite number in `range`. Chain ->default_value() as with po::value.
template <class T>
FSDPX_API boost::program_options::typed_value<T>* int_value(IntRange range);
FSDPX_API boost::program_options::typed_value<double>* float_value(FloatRange range);

}  // namespace fsdpx
