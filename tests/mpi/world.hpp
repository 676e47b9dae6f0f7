#pragma once
#include "ddp/comm/collectives.hpp"
#include "ddp/mpi/communicator.hpp"

namespace mpi_test {
ddp::mpi::communicator& comm();
}
