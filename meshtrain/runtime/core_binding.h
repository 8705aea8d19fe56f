// Binding a node's workers to cores of their own (meshrun --bind-cores-to-rank, as DeepSpeed's
// launcher does): the cores the launcher may use (or a given list of them) are split into equal
// contiguous shares, one per local worker, so that the scheduler never stacks two workers' busy
// threads on one core while another idles. Cores left over by the division stay unused.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace meshtrain::runtime {

// The cores this process may run on (its affinity mask), ascending.
std::vector<int> allowed_cpus();
// "0-3,8,10-11" -> {0, 1, 2, 3, 8, 10, 11}; ascending, without repeats. ValueError on bad syntax.
std::vector<int> parse_cpu_list(std::string_view text);
// The inverse: ascending cores as ranges ("0-3,8,10-11").
std::string format_cpu_list(const std::vector<int>& cpus);
// Worker i's share: cpus[i * k, (i + 1) * k) with k = cpus.size() / workers. ValueError when
// there are fewer cores than workers.
std::vector<std::vector<int>> split_cpus(const std::vector<int>& cpus, int workers);

}  // namespace meshtrain::runtime
