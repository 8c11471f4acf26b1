// fsdpx/interfaces.h: every plugin interface at once.
#pragma once

#include "fsdpx/activation_memory.h"
#include "fsdpx/checkpoint_backend.h"
#include "fsdpx/checkpoint_names.h"
#include "fsdpx/data_source.h"
#include "fsdpx/capabilities.h"
#include "fsdpx/evaluation.h"
#include "fsdpx/hf_interop.h"
#include "fsdpx/loss_scaling.h"
#include "fsdpx/model.h"
#include "fsdpx/optimizer.h"
#include "fsdpx/precision_policy.h"
#include "fsdpx/sharding_strategy.h"
#include "fsdpx/wrap_policy.h"
