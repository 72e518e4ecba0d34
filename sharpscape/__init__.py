"""``sharpscape``: the one command line of the toolkit and the files shipped with it.

* :mod:`sharpscape.command`: ``sharpscape run | table | study | figures | sharpness | surface |
  dashboard``, dispatching to the ``python -m`` entry points of the packages;
* :mod:`sharpscape.dashboard`: ``sharpscape dashboard``, the Streamlit dashboard on this machine only;
* :mod:`sharpscape.network`: whether a listening address is this machine only (every loopback
  spelling), for every server and launcher;
* :mod:`sharpscape.resources`: where the dashboard (``app/``) and the example configs (``configs/``)
  are, in a checkout and in an installed wheel, and which command runs a config (run or study).

Importing this package imports neither torch nor the library packages.
"""

__all__: list[str] = []
