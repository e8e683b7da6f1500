#include "step/step.h"
