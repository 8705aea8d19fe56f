# Labels and a timeout for every test, so that a run can pick what it can afford
# (`ctest -L unit`) and a hang fails in minutes instead of holding the suite.
#
# Included by CTest after the tests of every program were discovered (see CMakeLists.txt); the
# rule is by test name (Suite.Test, with any instantiation prefix or parameter suffix):
#
#   e2e      matches a regex in MT_E2E_TESTS: runs the built meshtrain or meshrun programs
#            (training runs, launchers, schedulers);                        timeout 300 s
#   process  else matches one in MT_PROCESS_TESTS: starts child processes or servers of its own
#            (fork, python3, etcd, prometheus, chromium, kubectl, namespaces); timeout 180 s
#   unit     everything else: one process, no children, seconds at most;   timeout 60 s
#
# and, beside that one, `root` when the test needs root (network or mount namespaces, cgroups,
# slurmd) and `gpu` when it needs a CUDA device. A new suite is a unit suite until it is listed
# here; if it starts programs it belongs in a list (and the unit timeout will say so if it is
# slow). tests/README.md describes the labels and the MESHTRAIN_TEST_REQUIRE switch.

set(MT_E2E_TESTS
  "^Cli(Bench)?\\." "^PlanCli\\." "^PlanValidation\\." "^CkptCli\\." "^PrometheusJobTest\\." "^TrainLogs\\."
  "^AsyncCheckpoint\\." "^CheckpointCrash\\." "^DiskFull\\." "^Elastic\\." "^ElasticFaults\\."
  "^FaultTolerance\\." "^MemoryLimit\\." "^MeshrunTest\\." "^MixedPrecisionRun\\."
  "^Rollback\\." "^ZeroRun\\." "^EtcdElastic\\." "^EtcdRendezvous\\." "^Mpirun\\." "^Slurm\\."
  "^PartitionedNode\\." "^ScrapeUnderLoad\\." "^SpikeRun\\." "^BestCheckpointRun\\."
  "^TimedCheckpointRun\\." "^LayerNormsRun\\." "^KernelTimesRun\\." "^GemmResumeRun\\." "^JobMetricsRun\\." "^PrometheusAlert\\."
  "^K8sPods\\." "^K8sPlacement\\." "^EnvCli\\." "^PipelineRun\\." "^TensorParallelRun\\."
  "^PipelineTensorParallelRun\\." "^MemoryGuardRun\\." "^TpCheckpointRun\\."
  "^PipelineZeroRun\\." "^ShmBudgetRun\\." "^MeshCheckpointRun\\." "^ClassifierRun\\." "^ResNetRun\\."
  "^ResNetTorchParity\\." "^MoERun\\." "^ParamServerRun\\." "^RunDirLockRun\\." "^BlockedWorkerRun\\."
  "^StragglerRun\\." "^GossipRun\\." "^S3CheckpointRun\\." "^TlsCli\\." "^S3DatasetRun\\.")

set(MT_PROCESS_TESTS
  "^(.*/)?Faults\\." "^TcpAuth\\." "^Watchdog\\." "^FileStoreTest\\.AddsFromForkedProcesses"
  "^EtcdStoreTest\\." "EtcdFactory>$" "^PrometheusScrapeTest\\." "^PrometheusRules\\."
  "^MetricsTest\\.PromtoolAcceptsOurOutput$" "^(.*/)?Manifests\\." "^BrokenManifests\\."
  "^ReportTest\\.RendersNonBlankInHeadlessChromium$" "^(.*/)?TorchParity\\." "^PythonReference\\."
  "^(.*/)?PipelineFaults\\."
  "^Safetensors\\.(ReadsFileWrittenByPython|PyTorchReadsOurFile)$" "^Netns\\."
  "^CommBuffer\\.(AFullDevShm|AGroupTooBigForDevShm|EightRanksFitASmallDevShm)"
  "^ShmBudgetMesh\\." "^(.*/)?AllToAllV(Processes|Faults)\\."
  "^RunDirLock\\.AKilledHolderNotYetReapedIsDead$" "^ObjectStore\\." "^Tls\\." "^FileLock\\.")

set(MT_ROOT_TESTS
  "^Netns\\." "^ElasticFaults\\.HostWithACutLink" "^MemoryLimit\\." "^Slurm\\."
  "^CommBuffer\\.(AFullDevShm|AGroupTooBigForDevShm|EightRanksFitASmallDevShm)"
  "^DiskFull\\." "^PartitionedNode\\." "^K8sPods\\." "^ShmBudgetMesh\\."
  "^PipelineTensorParallelRun\\.TwoHostsMatchOneRank$")

set(MT_GPU_TESTS
  "^CudaDevice\\." "^CudaOps\\." "^CudaTraining\\."
  "^NcclBackend\\.GroupOfOneRunsEveryCollective$")

function(mt_matches_any out name)
  set(hit FALSE)
  foreach(re IN LISTS ARGN)
    if(name MATCHES "${re}")
      set(hit TRUE)
      break()
    endif()
  endforeach()
  set(${out} ${hit} PARENT_SCOPE)
endfunction()

foreach(program IN LISTS MT_TEST_PROGRAMS)
  foreach(test IN LISTS ${program}_TESTS)
    mt_matches_any(is_e2e "${test}" ${MT_E2E_TESTS})
    mt_matches_any(is_process "${test}" ${MT_PROCESS_TESTS})
    mt_matches_any(is_root "${test}" ${MT_ROOT_TESTS})
    mt_matches_any(is_gpu "${test}" ${MT_GPU_TESTS})
    if(is_e2e)
      set(labels e2e)
      set(timeout 300)
    elseif(is_process)
      set(labels process)
      set(timeout 180)
    else()
      set(labels unit)
      set(timeout 60)
    endif()
    if(is_root)
      list(APPEND labels root)
    endif()
    if(is_gpu)
      list(APPEND labels gpu)
    endif()
    set_tests_properties("${test}" PROPERTIES LABELS "${labels}" TIMEOUT ${timeout})
  endforeach()
endforeach()
