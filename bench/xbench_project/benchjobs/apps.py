from django.apps import AppConfig


class BenchJobsConfig(AppConfig):
    name = "xbench_project.benchjobs"
    label = "bench"
